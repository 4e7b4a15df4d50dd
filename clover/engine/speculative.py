"""Self-speculative decoding: an AR model checks a block-diffusion drafter inside the same forward.

After Set Block Decoding (Gat et al., 2025) and self-speculative decoding. One model, two kinds of
rows over one KV cache:
- **clean rows** (tokens already written, and the last forward's drafts) run through the AR
  weights, causally: they see earlier clean tokens only, never a mask, so each row's logits are
  the AR model's next-token prediction, exactly as in plain AR decoding;
- **mask rows** (the rest of the current block) run through the diffusion weights; they see every
  clean token and each other, as in block diffusion, and draft the block's later tokens (shifted
  prediction: position q is read from row q - 1).
A draft is kept only if the next forward's clean rows predict the same token at its position
(greedy verification); at the first mismatch the AR model's own token is taken and the rest is
dropped. The output is therefore the AR model's greedy output, token for token (up to floating-
point ties), every forward commits at least one token, and the drafts decide the speed.

`pair_models` routes a diffusion model's linears (clean rows: the AR model's weights, mask rows:
its own); both must share everything else (embeddings, norms): two adapters over one base.
`SelfSpeculative` is the reference decoder: one sequence (`generate`) or several together
(`generate_batch`: one forward a step over every unfinished sequence, each with its own clean and
mask rows, padded), not yet in the engine's scheduler or the server.
"""

# Shapes: B sequences, L new tokens (clean then masks, padded), S key slots, V vocabulary

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from clover.engine import spec_sampling as sampled
from clover.engine.logprobs import token_logprob
from clover.engine.sampler import RowSampling
from clover.model.fused import FastLinear, packing_supported
from clover.model.transformer import CloverModel, KVCache

ROUTED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# each fast path's attribute and the routed linears it fuses (they read one input)
FUSED = {"qkv_fast": ("q_proj", "k_proj", "v_proj"), "o_fast": ("o_proj",),
         "gate_up_fast": ("gate_proj", "up_proj"), "down_fast": ("down_proj",)}


class Route:
    """Which rows of the current forward are mask rows ([B, L] bool; None: every row is clean)."""

    mask_BL: Tensor | None = None


class RoutedLinear(nn.Module):
    """The clean (AR) linear on clean rows, the masked (diffusion) linear on mask rows."""

    def __init__(self, clean: nn.Module, masked: nn.Module, route: Route) -> None:
        super().__init__()
        self.clean, self.masked, self.route = clean, masked, route

    def forward(self, x: Tensor) -> Tensor:
        m = self.route.mask_BL
        if m is None or not bool(m.any()):
            return self.clean(x)
        if bool(m.all()):
            return self.masked(x)
        out = self.clean(x)
        out[m] = self.masked(x[m]).to(out.dtype)
        return out


class LowRankRouted(nn.Module):
    """Routing with one full weight read: the AR model's linear (its adapter merged) on every
    row, and on mask rows also the low-rank difference of the two adapters, (B_d A_d - B_a A_a)
    x scale, as one pair of thin matmuls (`down_RI`, `up_OR`: the two adapters' factors side by
    side). Equal to `RoutedLinear` over the two merged linears, up to rounding."""

    def __init__(self, clean: nn.Module, down_RI: Tensor, up_OR: Tensor, route: Route) -> None:
        super().__init__()
        self.clean, self.route = clean, route
        self.register_buffer("down_RI", down_RI)
        self.register_buffer("up_OR", up_OR)

    def forward(self, x: Tensor) -> Tensor:
        out = self.clean(x)
        m = self.route.mask_BL
        if m is not None and bool(m.any()):
            out[m] = out[m] + (x[m] @ self.down_RI.T) @ self.up_OR.T
        return out


class RoutedFast:
    """The fast path of `LowRankRouted` linears that read one input. One fused matmul (prepacked
    on a CPU that allows it: `FastLinear`) computes the AR model's outputs and the drafter's
    low-rank inputs together on every row ([W_ar; down], the down factors side by side); then
    each linear's up factor adds its part on mask rows only (the other rows' inputs zeroed: no
    row gathering). With no mask row and an input the prepacked weight would not take (a long
    prefill) only the AR rows of the fused weight are read (shorter: the prepacked read of all
    rows measured faster). None, like `FastLinear`, when the reference linears must run
    (autograd, a changed weight). It keeps its own fused weights (plain and prepacked)."""

    def __init__(self, holder: nn.Module, names: tuple[str, ...], routed: list[LowRankRouted],
                 route: Route, pack: bool) -> None:
        weight_OI = torch.cat([r.clean.weight.detach() for r in routed])
        down_RI = torch.cat([r.down_RI for r in routed])
        biases = [getattr(r.clean, "bias", None) for r in routed]
        bias = None if biases[0] is None else torch.cat(
            [b.detach() for b in biases] + [down_RI.new_zeros(down_RI.shape[0])])
        pack = pack and weight_OI.device.type == "cpu" and packing_supported(weight_OI.dtype)
        # the clean linears under their own names: the fast path's validity is theirs
        self.both = FastLinear(holder, names, torch.cat([weight_OI, down_RI]), bias, pack)
        self.ups = [r.up_OR for r in routed]  # each [O_i, R_i], applied to its R_i inputs
        self.out_dim, self.route = weight_OI.shape[0], route

    def __call__(self, x: Tensor) -> Tensor | None:
        m = self.route.mask_BL
        masked = m is not None and bool(m.any())  # one device sync a linear, not two
        if not masked:  # a prefill: no down factors to compute
            clean = self.both.first_rows(x, self.out_dim)
            if clean is not None:
                return clean
        y = self.both(x)
        if y is None:
            return None
        out = y[..., :self.out_dim].contiguous()
        if not masked:
            return out
        low = y[..., self.out_dim:] * m[..., None].to(y.dtype)
        at_out = at_low = 0
        for up_OR in self.ups:
            n_out, n_low = up_OR.shape
            out[..., at_out:at_out + n_out] += F.linear(low[..., at_low:at_low + n_low], up_OR)
            at_out, at_low = at_out + n_out, at_low + n_low
        return out


@dataclass
class RoutedPair:
    """The diffusion model with its linears routed (`swapped`: each routed linear's parent,
    name and clean linear)."""

    model: CloverModel
    route: Route
    vocab: int  # the AR model's vocabulary: the mask token is never an output
    swapped: list[tuple[nn.Module, str, nn.Module]] = field(default_factory=list)
    low_rank: bool = False  # LowRankRouted: one full weight set, the drafter's as a difference
    fused: bool = False  # RoutedFast: the engine's fused (prepacked) linears (`fuse_pair`)


def pair_models(draft: CloverModel, ar: CloverModel) -> RoutedPair:
    """Route `draft`'s attention and dense-FFN linears (in place): clean rows through `ar`'s.
    ValueError if the two are not a causal model and a shifted-prediction diffusion model over
    one base (same embeddings for the AR vocabulary, same norms)."""
    dc, ac = draft.config, ar.config
    if ac.attention != "causal":
        raise ValueError(f"the AR model must be causal (its attention is {ac.attention!r})")
    if dc.attention != "block" or dc.mask_id is None or not dc.shift_logits:
        raise ValueError("the draft model must be a block-diffusion model with a mask token and "
                         "shifted prediction")
    if dc.num_experts or ac.num_experts:
        raise ValueError("self-speculative pairs route dense layers only (no MoE)")
    V = ac.vocab_size
    if draft.embed.weight.shape[0] < V or not torch.equal(draft.embed.weight[:V],
                                                          ar.embed.weight):
        raise ValueError("the two models' embeddings differ: not one base")
    if (draft.lm_head is None) != (ar.lm_head is None) or draft.lm_head is not None and not \
            torch.equal(draft.lm_head.weight[:V], ar.lm_head.weight):
        raise ValueError("the two models' output heads differ: not one base")
    for (name, a), (_, b) in zip(draft.named_parameters(), ar.named_parameters(), strict=True):
        if "norm" in name and not torch.equal(a, b):
            raise ValueError(f"the two models differ at {name}: not one base")
    pair = RoutedPair(draft, Route(), V)
    for layer_d, layer_a in zip(draft.layers, ar.layers, strict=True):
        for parent_d, parent_a in ((layer_d.attn, layer_a.attn), (layer_d.ffn, layer_a.ffn)):
            for name in ROUTED:
                if hasattr(parent_d, name):
                    clean = getattr(parent_a, name)
                    pair.swapped.append((parent_d, name, clean))
                    setattr(parent_d, name,
                            RoutedLinear(clean, getattr(parent_d, name), pair.route))
    return pair


def load_pair(ar_dir: str, draft_dir: str, *, device: str | torch.device = "cpu",
              dtype: torch.dtype | None = None, low_rank: bool = True):
    """(RoutedPair, the AR model's tokenizer) from two model directories. Two adapters over the
    base route as `LowRankRouted` (one weight set in memory) unless `low_rank` is off; other
    model directories as `RoutedLinear` over both models' weights."""
    from clover import checkpoint
    from clover.checkpoint import adapter

    draft, _ = checkpoint.load(draft_dir, device=device, dtype=dtype)
    ar, tokenizer = checkpoint.load(ar_dir, device=device, dtype=dtype)
    pair = pair_models(draft.eval(), ar.eval())
    if low_rank and adapter.is_adapter_dir(ar_dir) and adapter.is_adapter_dir(draft_dir):
        _low_rank(pair, adapter.read_adapter(ar_dir), adapter.read_adapter(draft_dir))
    return pair, tokenizer


def _low_rank(pair: RoutedPair, ar_adapter, draft_adapter) -> None:
    """Replace each `RoutedLinear` by a `LowRankRouted` over its clean (AR) linear: the AR model's
    merged weights stay, the drafter's merged ones go."""
    (ar_cfg, ar_state), (d_cfg, d_state) = ar_adapter, draft_adapter
    scale_a, scale_d = ar_cfg.lora_alpha / ar_cfg.r, d_cfg.lora_alpha / d_cfg.r
    names = {id(m): n for n, m in pair.model.named_modules()}
    for parent, name, clean in pair.swapped:
        key = f"{names[id(parent)]}.{name}"
        factors = [d_state.get(f"{key}.lora_A.weight"), ar_state.get(f"{key}.lora_A.weight")]
        if any(f is None for f in factors):
            raise ValueError(f"{key}: not a LoRA target of both adapters")
        a_d, a_a = factors
        b_d, b_a = d_state[f"{key}.lora_B.weight"], ar_state[f"{key}.lora_B.weight"]
        w = clean.weight  # the factors in the model's dtype, once, not in every forward
        down = torch.cat([a_d, a_a], 0).to(w.device, w.dtype)
        up = torch.cat([b_d * scale_d, -b_a * scale_a], 1).to(w.device, w.dtype)
        setattr(parent, name, LowRankRouted(clean, down, up, pair.route))
    pair.low_rank = True


def fuse_pair(pair: RoutedPair, pack: bool = True) -> RoutedPair:
    """The engine's inference fast paths (clover/model/fused.py) on a low-rank pair: its linears'
    clean weights fused per input (q/k/v, gate/up) and prepacked where the CPU allows, the
    drafter's differences beside them (`RoutedFast`), the head fused. The unfused `LowRankRouted`
    layers stay the reference (they run under autograd or after a weight changes)."""
    if not pair.low_rank:
        raise ValueError("fuse_pair needs a low-rank pair (load_pair with two adapters)")
    pair.model.fuse_projections(pack=pack)  # the head; routed layers are left unfused by it
    for layer in pair.model.layers:
        for parent in (layer.attn, layer.ffn):
            for attr, names in FUSED.items():
                if not hasattr(parent, attr):
                    continue
                routed = [getattr(parent, n) for n in names]
                if len({getattr(r.clean, "bias", None) is None for r in routed}) > 1:
                    setattr(parent, attr, None)  # biased and unbiased: the reference runs
                    continue
                holder = nn.Module()  # the clean linears under their own names
                for name, r in zip(names, routed, strict=True):
                    setattr(holder, name, r.clean)
                setattr(parent, attr, RoutedFast(holder, names, routed, pair.route, pack))
    pair.fused = True
    return pair


def visibility(length: int, n_clean: int, n_mask: int, num_slots: int,
               device: torch.device | str = "cpu") -> Tensor:
    """[L, S]: clean row j (position length + j) sees slots <= its position among the clean ones;
    a mask row sees every clean slot and every mask of this forward. Slots are positions (one
    sequence from slot 0)."""
    L = n_clean + n_mask
    pos_L = length + torch.arange(L, device=device)
    slot_S = torch.arange(num_slots, device=device)
    causal_LS = (slot_S[None, :] <= pos_L[:, None]) & (slot_S[None, :] < length + n_clean)
    is_mask_L = torch.arange(L, device=device) >= n_clean
    return torch.where(is_mask_L[:, None], (slot_S < length + L)[None, :], causal_LS)


@dataclass
class SpecResult:
    ids: list[int]  # generated tokens, through the first stop token
    forwards: int  # the prefill's included (it writes the first token)
    drafted: int  # drafts put to the check
    accepted_at: Counter  # accepted drafts by their place in the run (0 = first after the check)

    @property
    def tpf(self) -> float:
        return len(self.ids) / max(self.forwards, 1)


@dataclass
class _Row:
    """One sequence's decoding state in `SelfSpeculative.generate_batch`."""

    prompt_len: int
    seq: list[int]  # prompt and written tokens
    spec: list[int]  # drafts awaiting the check
    c: int  # cached positions
    res: SpecResult
    done: bool = False
    logprobs: int | None = None  # top-k of each written token's log-probability (None: none)
    token_logprobs: dict = field(default_factory=dict)  # position -> TokenLogprob
    sampling: RowSampling | None = None  # None: greedy; else speculative sampling
    q: Tensor | None = None  # the sampled drafts' distributions (spec_sampling)

    @property
    def start(self) -> int:
        """The first position nobody has written."""
        return len(self.seq) + len(self.spec)

    def finish(self, stop_ids: set[int], max_tokens: int) -> SpecResult:
        self.res.ids = trimmed(self.seq[self.prompt_len:], stop_ids, max_tokens)
        return self.res


def trimmed(out: list[int], stop_ids: set[int], max_tokens: int) -> list[int]:
    """Generated tokens through the first stop token and at most `max_tokens` (a forward may
    commit a few past either)."""
    end = next((j + 1 for j, t in enumerate(out) if t in stop_ids), len(out))
    return out[:min(end, max_tokens)]


class SelfSpeculative:
    """Self-speculative greedy decoding with a `RoutedPair` (see the module docstring).

    tau: drafts are put to the check left to right while their confidence is >= tau (0: the whole
    rest of the block); a lower bar only costs rows, never quality. `drafts=False`: no mask rows,
    plain AR decoding through the same loop (the baseline a speed ratio is taken against).
    `max_drafts`: at most that many drafts a forward (the mask rows stop one past the last one
    instead of at the block's end: fewer rows, where a forward's cost grows with its rows)."""

    def __init__(self, pair: RoutedPair, tau: float = 0.0, drafts: bool = True,
                 max_drafts: int | None = None) -> None:
        if max_drafts is not None and max_drafts < 1:
            raise ValueError(f"max_drafts must be >= 1 (got {max_drafts})")
        self.pair, self.tau, self.drafts, self.max_drafts = pair, tau, drafts, max_drafts
        cfg = pair.model.config
        self.block, self.mask_id = cfg.block_size, cfg.mask_id

    @torch.no_grad()
    def forward(self, cache: KVCache, clean: list[int], n_mask: int) -> Tensor:
        """`clean` tokens after the cached ones, then `n_mask` masks: [L, V] fp32 logits."""
        return self.forward_rows(cache, [0], [clean], [n_mask])[0]

    @torch.no_grad()
    def forward_rows(self, cache: KVCache, rows: list[int], clean: list[list[int]],
                     n_mask: list[int], last_only: bool = False) -> Tensor:
        """One forward over several cache rows: batch row b is `clean[b]` after cache row
        `rows[b]`'s cached tokens, then `n_mask[b]` masks, padded to the longest. [B, L, V] fp32
        logits (padding rows are garbage), or with `last_only` [B, V]: each row's last one."""
        model, route = self.pair.model, self.pair.route
        device = cache.pos_BS.device
        n_B = [len(c) + m for c, m in zip(clean, n_mask, strict=True)]
        B, L = len(rows), max(n_B)
        length_B, n_B_t = cache.length_B[rows], torch.tensor(n_B, device=device)
        ids = torch.full((B, L), self.mask_id, device=device)
        for b, c in enumerate(clean):
            ids[b, :len(c)] = torch.tensor(c, device=device)
        j_L = torch.arange(L, device=device)
        valid_BL = j_L[None] < n_B_t[:, None]
        num_slots = max(cache.end, int((length_B + n_B_t).max()))
        vis_BLS = torch.zeros(B, L, num_slots, dtype=torch.bool, device=device)
        for b, (n, c, m) in enumerate(zip(length_B.tolist(), clean, n_mask, strict=True)):
            vis_BLS[b, :n_B[b]] = visibility(n, len(c), m, num_slots, device)
        n_clean_B = torch.tensor([len(c) for c in clean], device=device)
        route.mask_BL = (j_L[None] >= n_clean_B[:, None]) & valid_BL
        last_BL = j_L[None] == n_B_t[:, None] - 1
        try:
            out = model(ids, length_B[:, None] + j_L, cache=cache, cache_rows=rows,
                        valid_BL=valid_BL, attn_mask_BLS=vis_BLS,
                        logits_mask_BL=last_BL if last_only else None)
        finally:
            route.mask_BL = None
        logits = out.logits[..., :self.pair.vocab].float()
        if self.mask_id is not None and self.mask_id < self.pair.vocab:
            logits[..., self.mask_id] = float("-inf")  # as the engine's sampler: never an output
        return logits

    def generate(self, prompt: list[int], max_tokens: int, stop_ids: set[int]) -> SpecResult:
        return self.generate_batch([prompt], max_tokens, stop_ids)[0]

    @torch.no_grad()
    def generate_batch(self, prompts: list[list[int]], max_tokens: int,
                       stop_ids: set[int]) -> list[SpecResult]:
        """Decode prompts together: one forward a step over every unfinished row (each with its
        own clean and mask rows, padded); a finished row leaves the batch. Each row's output is
        what `generate` gives it alone (up to floating-point ties); a result's `forwards` counts
        the forwards it took part in (the batch ran max of them)."""
        model = self.pair.model
        device = next(model.parameters()).device
        dtype = model.embed.weight.dtype
        capacity = max(map(len, prompts)) + max_tokens + 2 * self.block
        cache = KVCache(model.config, len(prompts), capacity, device, dtype)
        n = len(prompts)
        rows = self.prefill_rows(cache, list(range(n)), prompts, [0] * n, [stop_ids] * n,
                                 [max_tokens] * n)
        while active := [i for i, r in enumerate(rows) if not r.done]:
            self.step_rows(cache, active, [rows[i] for i in active], [stop_ids] * len(active),
                           [max_tokens] * len(active))
        return [r.finish(stop_ids, max_tokens) for r in rows]

    def prefill_rows(self, cache: KVCache, rows: list[int], prompts: list[list[int]],
                     heads: list[int], stop_ids: list[set[int]], max_tokens: list[int],
                     logprobs: list[int | None] | None = None,
                     sampling: list[RowSampling | None] | None = None) -> list[_Row]:
        """One forward over the prompts (all but the first `heads[b]` tokens, already in cache
        row `rows[b]`), which writes each one's first token: their decoding states. Per prompt,
        `logprobs`: the top-k of each written token's AR log-probability to record (None: no);
        `sampling`: how its tokens are drawn (None: greedy)."""
        clean = [p[n:] for p, n in zip(prompts, heads, strict=True)]
        last = self.forward_rows(cache, rows, clean, [0] * len(rows), last_only=True)
        sampling = sampling or [None] * len(rows)
        states, lengths = [], cache.length_B.clone()
        for b, (row, p, stop, most) in enumerate(zip(rows, prompts, stop_ids, max_tokens,
                                                     strict=True)):
            t = sampled.first(last[b], sampling[b])
            state = _Row(len(p), list(p) + [t], [], len(p), SpecResult([], 1, 0, Counter()),
                         logprobs=logprobs[b] if logprobs else None, sampling=sampling[b])
            if state.logprobs is not None:
                state.token_logprobs[len(p)] = token_logprob(last[b], t, state.logprobs)
            state.done = t in stop or most <= 1
            lengths[row] = len(p)
            states.append(state)
        cache.truncate(lengths)
        return states

    def step_rows(self, cache: KVCache, rows: list[int], states: list[_Row],
                  stop_ids: list[set[int]], max_tokens: list[int]) -> list[int]:
        """One forward over sequences `states` in cache rows `rows`: check each one's drafts,
        commit, draft anew. The tokens each row fed (clean + mask)."""
        n_mask = [self.n_mask(r) for r in states]
        clean = [r.seq[r.c:] + r.spec for r in states]
        logits = self.forward_rows(cache, rows, clean, n_mask)
        lengths = cache.length_B.clone()
        for b, (row, r) in enumerate(zip(rows, states, strict=True)):
            lengths[row] = self._advance(r, logits[b], stop_ids[b], max_tokens[b])
        cache.truncate(lengths)
        return [len(c) + m for c, m in zip(clean, n_mask, strict=True)]

    def n_mask(self, r: _Row) -> int:
        """Mask rows of row r's next forward: to its block's end (or its draft cap)."""
        return self._window_end(r.start) - r.start if self.drafts else 0

    def _advance(self, r: _Row, logits: Tensor, stop_ids: set[int], max_tokens: int) -> int:
        """Check row r's drafts against this forward's clean rows, commit, draft anew; the
        row's new cached length."""
        r.res.forwards += 1
        k = len(r.seq) - 1 - r.c  # row j is position c + j and predicts c + j + 1
        ok, own = sampled.check(logits[k:k + len(r.spec) + 1], r.spec, r.q, r.sampling)
        r.res.accepted_at.update(range(ok))
        r.res.drafted += len(r.spec)
        at = len(r.seq) + ok  # the position the AR model's own token fills
        new = r.spec[:ok] + [own]
        for pos, t in enumerate(new, len(r.seq)) if r.logprobs is not None else ():
            r.token_logprobs[pos] = token_logprob(logits[pos - 1 - r.c], t, r.logprobs)
        r.seq += new
        r.done = not stop_ids.isdisjoint(new) or len(r.seq) - r.prompt_len >= max_tokens
        # every draft held: this forward's drafts were made on the right tokens
        r.spec, r.q = sampled.drafts(logits[at - r.c:self._window_end(at) - 1 - r.c], self.tau,
                                     r.sampling) if ok == len(r.spec) else ([], None)
        r.c = at
        return at

    def _window_end(self, start: int) -> int:
        """One past the last mask row of a forward whose first unknown position is `start`: the
        block's end, or sooner with `max_drafts`."""
        end = (start // self.block + 1) * self.block
        return end if self.max_drafts is None else min(end, start + self.max_drafts + 1)
