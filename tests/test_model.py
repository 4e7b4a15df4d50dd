"""The transformer: attention masks, exact KV cache, selective logits, MoE against its reference."""

import pytest
import torch

from clover.config import get_preset
from clover.model import KVCache, build_model
from clover.model.moe import MoE, reference_moe
from clover.model.transformer import visibility


def _ids(B, L, seed=0, vocab=512):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (B, L), generator=g)


@pytest.mark.parametrize("router, shared", [("softmax", 1), ("sigmoid", 0), ("softmax", 0)])
def test_grouped_moe_matches_reference(router, shared):
    """Grouped expert computation is the same function as a loop over tokens and experts."""
    config = get_preset("tiny", router=router, num_shared_experts=shared, routed_scaling=1.7)
    torch.manual_seed(0)
    moe = MoE(config)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.2)
    moe.router.expert_bias.normal_()
    x = torch.randn(37, config.dim)
    fast, _, counts = moe(x)
    assert torch.allclose(fast, reference_moe(moe, x), atol=1e-5)
    assert int(counts.sum()) == 37 * config.num_experts_per_tok


def test_moe_counts_exclude_padding():
    config = get_preset("tiny")
    moe = MoE(config)
    torch.nn.init.normal_(moe.router.gate.weight)
    valid = torch.tensor([True] * 5 + [False] * 3)
    _, _, counts = moe(torch.randn(8, config.dim), valid)
    assert int(counts.sum()) == 5 * config.num_experts_per_tok


def test_causal_visibility_is_lower_triangular():
    pos = torch.arange(9)[None]
    assert torch.equal(visibility("causal", 1, pos, pos)[0], torch.tril(torch.ones(9, 9)).bool())


def test_block_visibility_is_own_and_earlier_blocks():
    """Position i sees exactly the positions of its own block and of every earlier block."""
    bs, n = 4, 13
    pos = torch.arange(n)[None]
    got = visibility("block", bs, pos, pos)[0]
    for i in range(n):
        expected = [j < (i // bs + 1) * bs for j in range(n)]
        assert got[i].tolist() == expected


def test_full_visibility_is_everything():
    pos = torch.arange(6)[None]
    assert visibility("full", 4, pos, pos).all()


def test_mask_mode_changes_the_function():
    """The three modes give different logits on the same weights (the mask is really applied)."""
    ids = _ids(1, 8)
    outs = []
    for mode in ("causal", "block", "full"):
        config = get_preset("tiny", attention=mode, block_size=1 if mode == "causal" else 4)
        outs.append(build_model(config, seed=0)(ids).logits)
    assert not torch.allclose(outs[0], outs[1]) and not torch.allclose(outs[1], outs[2])
    # The first token of the sequence sees only itself under causal, its block under block.
    assert torch.allclose(outs[0][0, -1], outs[0][0, -1])


def _cached_logits(model, ids, chunks):
    """Feed ids chunk by chunk through a KV cache, committing each chunk; concat logits."""
    cache = KVCache(model.config, ids.shape[0], capacity=64)
    outs, start = [], 0
    for size in chunks:
        out = model(ids[:, start:start + size], cache=cache)
        cache.commit(torch.full((ids.shape[0],), size))
        outs.append(out.logits)
        start += size
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("token_conv", [0, 3])
@pytest.mark.parametrize("mode", ["block", "causal"])
def test_cached_forward_equals_full_forward(mode, token_conv):
    """block/causal caches are exact: chunked decoding reproduces the one-shot logits (fp32),
    also with the token convolution (its inputs are cached beside the keys)."""
    bs = 1 if mode == "causal" else 4
    config = get_preset("tiny", attention=mode, block_size=bs, token_conv=token_conv)
    model = build_model(config, seed=1).eval()
    ids = _ids(2, 20)
    chunks = [8, 4, 4, 4] if mode == "block" else [7, 1, 1, 5, 6]
    with torch.no_grad():
        full = model(ids).logits
        cached = _cached_logits(model, ids, chunks)
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-5)


def test_provisional_block_is_overwritten_not_appended(tiny_block_model):
    """Re-running the active block (a denoising step) before commit leaves the cache exact."""
    model, ids = tiny_block_model, _ids(1, 12)
    cache = KVCache(model.config, 1, capacity=32)
    with torch.no_grad():
        model(ids[:, :8], cache=cache)
        cache.commit(torch.tensor([8]))
        model(torch.full((1, 4), model.config.mask_id), cache=cache)  # a draft step
        step = model(ids[:, 8:], cache=cache).logits
        full = model(ids).logits[:, 8:]
    torch.testing.assert_close(step, full, atol=1e-5, rtol=1e-5)


def test_padded_rows_match_unpadded(tiny_block_model):
    """Rows of different lengths padded into one batch give each row its own logits."""
    model = tiny_block_model
    a, b = _ids(1, 8, seed=3), _ids(1, 5, seed=4)
    batch = torch.cat([a, torch.cat([b, torch.zeros(1, 3, dtype=torch.long)], 1)])
    valid = torch.ones(2, 8, dtype=torch.bool)
    valid[1, 5:] = False
    with torch.no_grad():
        out = model(batch, valid_BL=valid).logits
        torch.testing.assert_close(out[0], model(a).logits[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out[1, :5], model(b).logits[0], atol=1e-5, rtol=1e-5)


def test_padded_cache_rows_match_alone(tiny_causal_model):
    """With a cache, a padded prefill plus per-row commits keeps every row exact."""
    model = tiny_causal_model
    a, b = _ids(1, 9, seed=5), _ids(1, 6, seed=6)
    cache = KVCache(model.config, 2, capacity=32)
    batch = torch.cat([a[:, :8], torch.cat([b[:, :5], torch.zeros(1, 3, dtype=torch.long)], 1)])
    valid = torch.tensor([[True] * 8, [True] * 5 + [False] * 3])
    with torch.no_grad():
        model(batch, cache=cache, valid_BL=valid)
        cache.commit(torch.tensor([8, 5]))
        nxt = model(torch.tensor([[a[0, 8]], [b[0, 5]]]), cache=cache).logits
        torch.testing.assert_close(nxt[0, 0], model(a).logits[0, 8], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(nxt[1, 0], model(b).logits[0, 5], atol=1e-5, rtol=1e-5)


def test_logits_mask_selects_the_same_logits(any_mode_config):
    """Computing logits only at selected positions gives exactly those rows of the full logits."""
    model = build_model(any_mode_config, seed=2).eval()
    ids = _ids(2, 10)
    sel = torch.rand(2, 10, generator=torch.Generator().manual_seed(0)) < 0.4
    with torch.no_grad():
        full = model(ids).logits
        part = model(ids, logits_mask_BL=sel).logits
    assert part.shape == (int(sel.sum()), any_mode_config.vocab_size)
    torch.testing.assert_close(part, full[sel])


def test_moe_stats_come_back(tiny_block_model):
    out = tiny_block_model(_ids(2, 8))
    config = tiny_block_model.config
    num_moe = config.num_layers - config.num_dense_layers
    assert out.moe.counts_LE.shape == (num_moe, config.num_experts)
    assert int(out.moe.counts_LE.sum()) == num_moe * 16 * config.num_experts_per_tok
    assert (out.moe.unique_experts >= 1).all() and out.moe.aux_loss > 0


def test_partial_rotary_and_bias_variants_run_and_cache_exactly():
    """Shapes of the public models (partial RoPE, QKV bias, untied head, dense) stay exact."""
    config = get_preset("tiny", partial_rotary=0.5, qkv_bias=True, qk_norm=False, num_experts=0,
                        tie_embeddings=False)
    model = build_model(config, seed=0).eval()
    for p in model.parameters():  # make biases non-zero so they matter
        if p.ndim == 1:
            torch.nn.init.normal_(p)
    ids = _ids(1, 12)
    with torch.no_grad():
        torch.testing.assert_close(_cached_logits(model, ids, [8, 4]), model(ids).logits,
                                   atol=1e-5, rtol=1e-5)


def test_token_conv_equals_a_depthwise_conv1d_over_positions():
    """On a plain forward (positions 0..L-1 in tensor order) the layer is x + conv1d(x) with a
    left-padded depthwise kernel: the form measured in benchmarks/copy_probe.py."""
    import torch.nn.functional as F

    from clover.model.transformer import TokenConv, visibility

    conv = TokenConv(8, 3)
    torch.nn.init.normal_(conv.weight)
    h = torch.randn(2, 10, 8)
    pos = torch.arange(10).expand(2, 10)
    got = conv(h, h, pos, pos, visibility("causal", 1, pos, pos))
    kernel = conv.weight.flip(0).T[:, None, :]  # [D, 1, K]: the last tap is the token itself
    ref = h + F.conv1d(F.pad(h.transpose(1, 2), (2, 0)), kernel, groups=8).transpose(1, 2)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["causal", "block", "full"])
def test_token_conv_looks_back_width_minus_one_positions_and_never_forward(mode):
    """Whatever attention may see, the convolution reaches positions p - K + 1 .. p only."""
    from clover.model.transformer import TokenConv, visibility

    conv = TokenConv(8, 3)
    torch.nn.init.normal_(conv.weight)
    pos = torch.arange(10).expand(2, 10)
    mask = visibility(mode, 4, pos, pos)
    x = torch.randn(2, 10, 8)
    y = conv(x, x, pos, pos, mask)
    earlier = x.clone()
    earlier[:, 4] += 1.0  # reaches positions 4, 5, 6 and no further
    changed = (conv(earlier, earlier, pos, pos, mask) - y).abs().sum(-1)[0] > 0
    assert changed.tolist() == [False] * 4 + [True] * 3 + [False] * 3


def test_token_conv_rows_are_independent_with_padding_and_drafts():
    """Padding rows, a re-run draft block and a padded cache all leave token_conv logits exact."""
    model = build_model(get_preset("tiny", attention="block", block_size=4, token_conv=4),
                        seed=2).eval()
    a, b = _ids(1, 12, seed=3), _ids(1, 8, seed=4)  # prefixes end on block edges, as decoding
    cache = KVCache(model.config, 2, capacity=32)
    batch = torch.cat([a[:, :8], torch.cat([b[:, :4], torch.zeros(1, 4, dtype=torch.long)], 1)])
    valid = torch.tensor([[True] * 8, [True] * 4 + [False] * 4])
    with torch.no_grad():
        model(batch, cache=cache, valid_BL=valid)
        cache.commit(torch.tensor([8, 4]))
        model(torch.full((2, 4), model.config.mask_id), cache=cache)  # a draft step
        nxt = model(torch.cat([a[:, 8:12], b[:, 4:8]]), cache=cache).logits
        torch.testing.assert_close(nxt[0], model(a).logits[0, 8:12], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(nxt[1], model(b).logits[0, 4:8], atol=1e-5, rtol=1e-5)


def test_cache_overflow_is_a_clear_error(tiny_block_model):
    cache = KVCache(tiny_block_model.config, 1, capacity=4)
    with pytest.raises(ValueError, match="KV cache overflow"):
        tiny_block_model(_ids(1, 8), cache=cache)


def test_bf16_model_runs_and_keeps_fp32_rope():
    model = build_model(get_preset("tiny"), dtype=torch.bfloat16)
    out = model(_ids(1, 8))
    assert out.logits.dtype == torch.bfloat16 and torch.isfinite(out.logits.float()).all()
    assert model.rotary.inv_freq(torch.device("cpu")).dtype == torch.float32
