"""`clover inspect MODEL --plan`: how a model splits over GPUs, from its config alone.

Pure arithmetic on the meta-device model's parameter counts (no weights, no GPU): for training
under FSDP2 (`clover train --parallel fsdp`: fp32 master weights, gradients and AdamW state
sharded over all GPUs, one unit gathered in bf16 at a time) and for serving as replicas, tensor
parallelism or expert parallelism, it gives each GPU's bytes for weights, optimizer state, KV
cache and activations, and whether that fits. Estimates, stated with their assumptions in
`ASSUMPTIONS`; a real run's allocator overhead and fragmentation come on top.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clover.config import ModelConfig

GIB = 2**30
BF16, FP32 = 2, 4
ASSUMPTIONS = (
    "--gpu-mem is GiB; 10% of it is kept back for the CUDA context, allocator and workspaces",
    "training: bf16 compute, fp32 master weights + fp32 gradients + AdamW m and v (16 B/param), "
    "sharded over every GPU (FSDP2); the largest unit (a block's MoE) gathered in bf16 twice "
    "(one prefetched)",
    "training activations: bf16, per token per layer as counted in `activation_bytes_per_token`; "
    "block diffusion runs clean + noisy copies, so 2x the tokens; fp32 logits for every token "
    "(an upper bound: the loss reads only target positions)",
    "serving: bf16 weights and KV cache; workspace for one 32-token block x 64 rows; 'KV tokens' "
    "is per model copy (a copy: one GPU for replicas and expert parallel's attention, all GPUs for "
    "tensor parallel)",
    "tensor parallel: heads, FFN/expert widths, embedding and head (by vocabulary) split; KV heads "
    "replicated when fewer than GPUs",
    "expert parallel: routed experts split over GPUs, everything else replicated (attention data "
    "parallel, as SGLang/vLLM DP-attention + EP); not built in Clover yet",
)


@dataclass(kw_only=True)
class PlanConfig:
    gpus: int = 8
    gpu_mem_gib: float = 80.0
    seq_len: int = 4096  # tokens per training sequence / serving context
    micro_batch: int = 1  # training sequences per GPU per forward

    def __post_init__(self) -> None:
        for name in ("gpus", "seq_len", "micro_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1 "
                                 f"(got {getattr(self, name)})")
        if self.gpu_mem_gib <= 0:
            raise ValueError(f"--gpu-mem must be > 0 GiB (got {self.gpu_mem_gib})")


@dataclass
class Counts:
    """Parameter counts by where they live."""

    total: int
    routed: int  # routed experts (split by expert parallelism)
    embed: int  # embedding + output head
    largest_unit: int  # the biggest FSDP unit (a block's attention or its FFN / MoE)


def counts(config: ModelConfig) -> Counts:
    from clover.model import build_model

    model = build_model(config, device="meta")
    total = sum(p.numel() for p in model.parameters())
    routed = sum(p.numel() for b in model.layers if b.is_moe
                 for p in b.ffn.experts.parameters())
    embed = model.embed.weight.numel() + (model.lm_head.weight.numel() if model.lm_head else 0)
    largest = max(sum(p.numel() for p in m.parameters()) for b in model.layers
                  for m in (b.attn, b.ffn))
    return Counts(total, routed, embed, largest)


def activation_bytes_per_token(config: ModelConfig) -> int:
    """bf16 bytes autograd keeps per token per layer (no checkpointing): norms, q/k/v, attention
    output, and per active expert its gate, up and product (router scores fp32)."""
    c = config
    attn = 2 * c.dim + c.num_heads * c.head_dim * 2 + 2 * c.num_kv_heads * c.head_dim
    if c.is_moe:
        active = c.num_experts_per_tok + c.num_shared_experts
        ffn = c.dim + 3 * active * c.expert_ffn_dim + c.num_experts * FP32 // BF16
    else:
        ffn = c.dim + 3 * c.ffn_dim
    return (attn + ffn) * BF16


def kv_bytes_per_token(config: ModelConfig, kv_heads: int | None = None) -> int:
    heads = config.num_kv_heads if kv_heads is None else kv_heads
    per_token = 2 * config.num_layers * heads * config.head_dim
    if config.token_conv:
        per_token += config.num_layers * config.dim
    return per_token * BF16


def training(config: ModelConfig, n: Counts, plan: PlanConfig) -> dict[str, Any]:
    """FSDP2 over every GPU, with and without per-block activation checkpointing."""
    copies = 2 if config.attention == "block" else 1  # clean + noisy copies of the sequence
    tokens = plan.micro_batch * plan.seq_len * copies
    states = 16 * n.total / plan.gpus
    gathered = 2 * n.largest_unit * BF16
    logits = tokens * config.vocab_size * FP32
    full_acts = tokens * config.num_layers * activation_bytes_per_token(config)
    ckpt_acts = tokens * (config.num_layers * config.dim * BF16
                          + activation_bytes_per_token(config))
    base = states + gathered + logits
    return {"sharded_states": states, "gathered_units": gathered, "logits": logits,
            "activations": full_acts, "activations_checkpointed": ckpt_acts,
            "total": base + full_acts, "total_checkpointed": base + ckpt_acts,
            "tokens_per_gpu": tokens}


def serving(config: ModelConfig, n: Counts, plan: PlanConfig) -> dict[str, dict[str, Any]]:
    """Per-GPU weights and KV-cache room for replicas, tensor and expert parallelism."""
    g = plan.gpus
    tp_kv_heads = max(config.num_kv_heads // g, 1)
    layouts = {
        "replicas": (n.total * BF16, kv_bytes_per_token(config), g),
        "tensor": (n.total * BF16 / g, kv_bytes_per_token(config, tp_kv_heads), 1),
        "expert": (((n.total - n.routed) + n.routed / g) * BF16, kv_bytes_per_token(config), g),
    }
    usable = plan.gpu_mem_gib * GIB * 0.9
    out = {}
    for name, (weights, kv_token, groups) in layouts.items():
        workspace = 32 * 64 * activation_bytes_per_token(config)  # a 32-token block x 64 rows
        room = usable - weights - workspace
        out[name] = {"weights": weights, "kv_bytes_per_token": kv_token, "workspace": workspace,
                     "kv_tokens": max(int(room // kv_token), 0), "model_copies": groups,
                     "fits": room > 0}
    return out


def make_plan(config: ModelConfig, plan: PlanConfig) -> dict[str, Any]:
    n = counts(config)
    train = training(config, n, plan)
    usable = plan.gpu_mem_gib * GIB * 0.9
    train["fits"] = train["total"] <= usable
    train["fits_checkpointed"] = train["total_checkpointed"] <= usable
    return {"name": config.name, "gpus": plan.gpus, "gpu_mem_gib": plan.gpu_mem_gib,
            "usable_bytes": usable, "seq_len": plan.seq_len, "micro_batch": plan.micro_batch,
            "params": {"total": n.total, "routed_experts": n.routed, "embed_and_head": n.embed,
                       "largest_fsdp_unit": n.largest_unit},
            "training_fsdp": train, "serving": serving(config, n, plan),
            "min_gpus_fsdp": _min_gpus(config, n, plan, "total"),
            "min_gpus_fsdp_checkpointed": _min_gpus(config, n, plan, "total_checkpointed"),
            "assumptions": list(ASSUMPTIONS)}


def _min_gpus(config: ModelConfig, n: Counts, plan: PlanConfig, key: str) -> int | None:
    """The fewest GPUs of this size whose FSDP2 training `key` fits (None: more than 1024)."""
    usable = plan.gpu_mem_gib * GIB * 0.9
    for g in range(1, 1025):
        trial = PlanConfig(gpus=g, gpu_mem_gib=plan.gpu_mem_gib, seq_len=plan.seq_len,
                           micro_batch=plan.micro_batch)
        if training(config, n, trial)[key] <= usable:
            return g
    return None


def render_plan(p: dict[str, Any]) -> str:
    """The plan as text tables (per GPU, GiB) and its assumptions."""
    from rich.console import Console

    console = Console(record=True, width=100)
    with console.capture() as capture:
        console.print(_train_table(p))
        console.print(f"fewest {p['gpu_mem_gib']:g} GiB GPUs for FSDP2 training: "
                      f"{p['min_gpus_fsdp']} (no checkpointing, as `clover train` runs today), "
                      f"{p['min_gpus_fsdp_checkpointed']} with per-block checkpointing")
        console.print(_serve_table(p))
        for line in p["assumptions"]:
            console.print(f"- {line}", highlight=False)
    return capture.get()


def _gib(nbytes: float) -> str:
    return f"{nbytes / GIB:,.1f}"


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"


def _train_table(p: dict[str, Any]):
    from rich.table import Table

    t = p["training_fsdp"]
    table = Table(title=f"train {p['name']} with FSDP2 on {p['gpus']} x {p['gpu_mem_gib']:g} GiB "
                        f"(micro-batch {p['micro_batch']} x {p['seq_len']} tokens), GiB per GPU")
    for col in ("", "no checkpointing", "per-block checkpointing"):
        table.add_column(col, justify="right" if col else "left")
    rows = [("params + grads + AdamW (fp32, sharded)", t["sharded_states"], t["sharded_states"]),
            ("gathered units (bf16)", t["gathered_units"], t["gathered_units"]),
            ("logits (fp32)", t["logits"], t["logits"]),
            ("activations (bf16)", t["activations"], t["activations_checkpointed"]),
            ("total", t["total"], t["total_checkpointed"])]
    for label, a, b in rows:
        table.add_row(label, _gib(a), _gib(b))
    table.add_row(f"fits in {_gib(p['usable_bytes'])}", _yes(t["fits"]),
                  _yes(t["fits_checkpointed"]))
    return table


def _serve_table(p: dict[str, Any]):
    from rich.table import Table

    table = Table(title=f"serve {p['name']} on {p['gpus']} GPUs (bf16), per GPU")
    for col in ("layout", "model copies", "weights GiB", "KV KiB/token",
                "KV tokens per copy", "fits"):
        table.add_column(col, justify="left" if col == "layout" else "right")
    for name, s in p["serving"].items():
        table.add_row(name, str(s["model_copies"]), _gib(s["weights"]),
                      f"{s['kv_bytes_per_token'] / 1024:,.1f}", f"{s['kv_tokens']:,}",
                      _yes(s["fits"]))
    return table
