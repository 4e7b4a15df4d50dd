"""Every inference fast path against its reference: fused q/k/v and gate/up projections, the
all-valid cache write, the bf16 norm (against transformers' own), and decoding at temperature 0."""

from types import SimpleNamespace

import pytest
import torch

from clover.checkpoint import load_model, save
from clover.config import get_preset
from clover.engine import LLM, SamplingParams
from clover.model import KVCache, build_model, fused

CONFIGS = {
    "tiny (block, MoE, qk-norm)": dict(),
    "causal, no qk-norm": dict(attention="causal", block_size=1, qk_norm=False),
    "causal, qkv bias, partial rope": dict(attention="causal", block_size=1, qk_norm=False,
                                           qkv_bias=True, partial_rotary=0.5),
}


def _model(overrides: dict, seed: int = 0):
    model = build_model(get_preset("tiny", **overrides), seed=seed)
    if overrides.get("qkv_bias"):
        for layer in model.layers:
            for lin in (layer.attn.q_proj, layer.attn.k_proj, layer.attn.v_proj):
                torch.nn.init.normal_(lin.bias, std=0.5)
    return model.eval()


def _ids(B, L, seed=0):
    return torch.randint(3, 512, (B, L), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
def test_fused_forward_equals_separate_projections(overrides):
    """One matmul for q/k/v (and gate/up) computes the same logits as the separate layers."""
    model = _model(overrides)
    ids = _ids(2, 9)
    with torch.inference_mode():
        ref = model(ids).logits
        fused = model.fuse_projections()(ids).logits
    assert all(layer.attn.qkv_fast is not None for layer in model.layers)
    torch.testing.assert_close(fused, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
def test_fused_engine_decodes_the_same_tokens(overrides):
    """Greedy decoding with the fused model gives the tokens of the reference projections."""
    llm = LLM(_model(overrides), device="cpu", dtype="float32")
    prompts = [_ids(1, 7, seed=1)[0].tolist(), _ids(1, 12, seed=2)[0].tolist()]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    fast_qkv = llm.engine.model.layers[0].attn.qkv_fast
    assert fast_qkv is not None  # the runner fused it, and prepacked it where oneDNN can
    assert (fast_qkv.packed is not None) == fused.fp32_packing_supported()
    fast = [o.token_ids for o in llm.generate(prompts, params)]
    llm.engine.model.fuse_projections(enabled=False)
    assert [o.token_ids for o in llm.generate(prompts, params)] == fast


def test_fp32_prepacked_weights_serve_small_inputs_and_plain_ones_the_rest(monkeypatch):
    """An fp32 CPU weight's oneDNN-prepacked copy serves inputs of up to FP32_PACKED_MAX_TOKENS
    tokens (within rounding of F.linear: another summation order); larger inputs run the plain
    fused weight through F.linear."""
    if not fused.fp32_packing_supported():
        pytest.skip("no oneDNN fp32 linear in this torch build")
    monkeypatch.setattr(fused, "FP32_PACKED_MAX_TOKENS", 6)
    plain_calls = []

    def plain(x, w, b=None):
        plain_calls.append(x.shape[:-1])
        return torch.nn.functional.linear(x, w, b)

    monkeypatch.setattr(fused, "F", SimpleNamespace(linear=plain))
    attn = _model({}).layers[0].attn
    fast = fused.FastLinear.build(attn, ("q_proj", "k_proj", "v_proj"), pack=True)
    assert fast.packed is not None
    weight = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach()
    with torch.no_grad():
        for shape in ((1, 1), (2, 3), (1, 7), (2, 4)):
            x = torch.randn(*shape, weight.shape[1])
            torch.testing.assert_close(fast(x), x @ weight.T, atol=1e-5, rtol=1e-5)
    assert plain_calls == [(1, 7), (2, 4)]


def test_fusing_keeps_the_state_dict_and_follows_in_place_updates(tmp_path):
    """Fusion copies nothing the state dict can see: same keys and values, saves and loads as
    before, and after an in-place load_state_dict no stale weight is used."""
    model, other = _model({}, seed=0), _model({}, seed=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.fuse_projections()
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    reloaded = load_model(save(model, None, tmp_path / "m"))
    assert all(torch.equal(reloaded.state_dict()[k], before[k]) for k in before)
    model.load_state_dict(other.state_dict())
    with torch.inference_mode():
        torch.testing.assert_close(model(_ids(1, 6)).logits, other(_ids(1, 6)).logits)


def test_fused_path_steps_aside_for_autograd_and_new_weights():
    """Under autograd the separate layers run (gradients reach them); replacing a weight or
    changing dtype unlinks the fused tensor and the reference path runs."""
    model = _model({}).fuse_projections()
    model(_ids(1, 5)).logits.sum().backward()
    assert model.layers[0].attn.q_proj.weight.grad is not None
    assert model.layers[0].ffn.gate_proj.weight.grad is not None  # layer 0 is a dense SwiGLU
    attn, x = model.layers[0].attn, torch.randn(1, 3, model.config.dim)
    with torch.no_grad():
        assert attn.qkv_fast(x) is not None
        attn.k_proj.weight = torch.nn.Parameter(attn.k_proj.weight.clone() * 2)
        assert attn.qkv_fast(x) is None
        model.layers[1].attn.o_proj.weight.mul_(2)  # in place: the packed copy would be stale
        assert model.layers[1].attn.o_fast(x) is None
        model.to(torch.bfloat16)
        assert model.layers[1].attn.qkv_fast(x.bfloat16()) is None


@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
def test_bf16_prepacked_fast_paths_decode_like_the_reference(overrides):
    """bf16 on CPU: fused and oneDNN-prepacked weights (small inputs) and plain fused matmuls
    (larger ones) decode the tokens of the reference layers at temperature 0."""
    model = _model(overrides).to(torch.bfloat16)
    llm = LLM(model, device="cpu", dtype="bfloat16")
    packed = model.layers[0].attn.qkv_fast.packed is not None
    assert packed == fused.bf16_packing_supported() and model.head_fast is not None
    prompts = [_ids(1, 21, seed=3)[0].tolist(), _ids(1, 5, seed=4)[0].tolist()]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    fast = [o.token_ids for o in llm.generate(prompts, params)]
    model.fuse_projections(enabled=False)
    assert [o.token_ids for o in llm.generate(prompts, params)] == fast


def test_bf16_without_onednn_packing_keeps_the_fused_plain_weights(monkeypatch):
    """On a CPU where oneDNN cannot prepack bf16 (AVX2 only: its reorder raises), bf16 decoding
    runs on the fused plain weights and gives the reference layers' tokens."""
    monkeypatch.setattr(fused, "bf16_packing_supported", lambda: False)
    model = _model({}).to(torch.bfloat16)
    llm = LLM(model, device="cpu", dtype="bfloat16")
    assert model.layers[0].attn.qkv_fast is not None
    assert all(f.packed is None for f in (model.layers[0].attn.qkv_fast, model.head_fast))
    prompts = [_ids(1, 21, seed=3)[0].tolist()]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    fast = [o.token_ids for o in llm.generate(prompts, params)]
    model.fuse_projections(enabled=False)
    assert [o.token_ids for o in llm.generate(prompts, params)] == fast


def test_all_valid_cache_write_equals_padded_write():
    """Writing every token in its [B, L] layout fills the cache like the per-token selection."""
    config = get_preset("tiny", attention="causal", block_size=1)
    model = _model({"attention": "causal", "block_size": 1}).fuse_projections()
    ids = _ids(2, 6)
    dense, padded = KVCache(config, 2, 16), KVCache(config, 2, 16)
    valid = torch.ones(2, 6, dtype=torch.bool)
    valid[1, 5] = False
    with torch.inference_mode():
        model(ids[:, :5], cache=dense)  # every token valid
        model(ids, cache=padded, valid_BL=valid)  # row 1's last token is padding
    for a, b in zip(dense.k + dense.v, padded.k + padded.v, strict=True):
        torch.testing.assert_close(a[:, :, :5], b[:, :, :5])
    assert padded.valid_BS[1, :6].tolist() == [True] * 5 + [False]


def test_bf16_norm_rounds_like_transformers_llama():
    """In bf16 the normalised value is rounded before the weight scales it, exactly as
    transformers' LlamaRMSNorm: bitwise equal outputs (so greedy bf16 decodes agree)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from clover.model.layers import RMSNorm

    ours, theirs = RMSNorm(64, 1e-5), LlamaRMSNorm(64, eps=1e-5)
    weight = torch.randn(64)
    ours.weight.data, theirs.weight.data = weight.clone(), weight.clone()
    ours, theirs = ours.to(torch.bfloat16), theirs.to(torch.bfloat16)
    x = (3 * torch.randn(4, 7, 64)).to(torch.bfloat16)
    assert torch.equal(ours(x), theirs(x))


def test_int8_dtype_quantizes_the_engine_model():
    """`--dtype int8` loads torchao weight-only int8 linears (the tied head stays float) and
    decodes; the fused fast paths step aside for quantized weights."""
    pytest.importorskip("torchao")
    llm = LLM(_model(CONFIGS["causal, no qk-norm"]), device="cpu", dtype="int8")
    attn = llm.engine.model.layers[0].attn
    assert type(attn.q_proj.weight.data) is not torch.Tensor and attn.qkv_fast is None
    out = llm.generate([_ids(1, 6)[0].tolist()], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(out[0].token_ids) == 4
