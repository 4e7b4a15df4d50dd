"""A synthetic LLaDA2.x checkpoint in the published BailingMoeV2 layout, and a plain reference.

`tiny_llada2_config` mirrors the field names of inclusionAI/LLaDA2.0-mini's config.json at tiny
size; `random_llada2_tensors` fills every published key (fused `query_key_value`, `dense`,
query/key layernorms, a leading dense layer, `mlp.gate.weight` + `expert_bias`, per-expert
`mlp.experts.E.*`, `shared_experts`) with random values. `reference_logits` is BailingMoeV2's
forward written out step by step over those tensors (no Clover code), so a converted checkpoint
can be checked against the published math itself.
"""

# Shapes: B batch, L length, D dim, H heads, G kv heads, Dh head dim, E experts, K top-k

from __future__ import annotations

import torch
import torch.nn.functional as F


def tiny_llada2_config(**overrides) -> dict:
    config = {
        "architectures": ["LLaDA2MoeModelLM"], "model_type": "llada2_moe",
        "auto_map": {"AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
                     "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM"},
        "vocab_size": 320, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "hidden_act": "silu", "use_qkv_bias": False, "use_bias": False, "use_qk_norm": True,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "max_position_embeddings": 512,
        "rope_theta": 600000.0, "rope_scaling": None, "partial_rotary_factor": 0.5,
        "num_experts": 8, "num_shared_experts": 1, "num_experts_per_tok": 3, "n_group": 4,
        "topk_group": 2, "moe_intermediate_size": 32, "first_k_dense_replace": 1,
        "routed_scaling_factor": 2.5, "score_function": "sigmoid",
        "moe_router_enable_expert_bias": True, "norm_topk_prob": True, "router_dtype": "fp32",
        "num_nextn_predict_layers": 0, "output_router_logits": False, "use_cache": False,
        "pad_token_id": 300, "eos_token_id": 301, "mask_token_id": 302, "block_size": 4,
        "torch_dtype": "float32",
    }
    return {**config, **overrides}


def random_llada2_tensors(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, std=0.1):
        return torch.randn(*shape, generator=gen) * std

    D, Dh = config["hidden_size"], config["head_dim"]
    H, G = config["num_attention_heads"], config["num_key_value_heads"]
    E, F_, Fd = config["num_experts"], config["moe_intermediate_size"], config["intermediate_size"]
    t = {"model.word_embeddings.weight": rnd(config["vocab_size"], D, std=1.0),
         "model.norm.weight": 1 + rnd(D), "lm_head.weight": rnd(config["vocab_size"], D)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1 + rnd(D)
        t[p + "attention.query_key_value.weight"] = rnd((H + 2 * G) * Dh, D)
        if config["use_qkv_bias"]:
            t[p + "attention.query_key_value.bias"] = rnd((H + 2 * G) * Dh)
        t[p + "attention.dense.weight"] = rnd(D, H * Dh)
        t[p + "attention.query_layernorm.weight"] = 1 + rnd(Dh)
        t[p + "attention.key_layernorm.weight"] = 1 + rnd(Dh)
        t[p + "post_attention_layernorm.weight"] = 1 + rnd(D)
        if i < config["first_k_dense_replace"]:
            t.update(_mlp(p + "mlp.", D, Fd, rnd))
            continue
        t[p + "mlp.gate.weight"] = rnd(E, D, std=0.5)
        t[p + "mlp.gate.expert_bias"] = rnd(E, std=0.3)
        for e in range(E):
            t.update(_mlp(p + f"mlp.experts.{e}.", D, F_, rnd))
        t.update(_mlp(p + "mlp.shared_experts.", D, F_ * config["num_shared_experts"], rnd))
    return t


def _mlp(prefix: str, dim: int, hidden: int, rnd) -> dict[str, torch.Tensor]:
    return {prefix + "gate_proj.weight": rnd(hidden, dim),
            prefix + "up_proj.weight": rnd(hidden, dim),
            prefix + "down_proj.weight": rnd(dim, hidden)}


# ---- the published math, written out ------------------------------------------------------------

def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def swiglu(x, t, prefix):
    gate, up = x @ t[prefix + "gate_proj.weight"].T, x @ t[prefix + "up_proj.weight"].T
    return (F.silu(gate) * up) @ t[prefix + "down_proj.weight"].T


def rope(x_BHLDh, pos_L, rot, theta):
    """Rotate-half RoPE on the first `rot` dims of each head; the rest passes through."""
    inv = 1.0 / theta ** (torch.arange(0, rot, 2, dtype=torch.float) / rot)
    ang = pos_L[:, None].float() * inv
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    x_rot, x_pass = x_BHLDh[..., :rot], x_BHLDh[..., rot:]
    half = rot // 2
    rotated = torch.cat([-x_rot[..., half:], x_rot[..., :half]], -1)
    return torch.cat([x_rot * cos + rotated * sin, x_pass], -1)


def route_one(score_E, bias_E, c):
    """One token's group-limited top-k: returns (experts, weights), plainly, with loops."""
    E, groups = c["num_experts"], c["n_group"]
    size = E // groups
    biased = [float(score_E[e] + bias_E[e]) for e in range(E)]
    group_score = [sum(sorted(biased[g * size:(g + 1) * size], reverse=True)[:2])
                   for g in range(groups)]
    keep = sorted(range(groups), key=lambda g: -group_score[g])[:c["topk_group"]]
    eligible = [e for e in range(E) if e // size in keep]
    chosen = sorted(eligible, key=lambda e: -biased[e])[:c["num_experts_per_tok"]]
    w = torch.stack([score_E[e] for e in chosen])
    w = w / (w.sum() + 1e-20) * c["routed_scaling_factor"]
    return chosen, w


def moe(x_ND, t, p, c):
    scores_NE = torch.sigmoid(x_ND @ t[p + "mlp.gate.weight"].T)
    out = torch.zeros_like(x_ND)
    for n in range(x_ND.shape[0]):
        chosen, w = route_one(scores_NE[n], t[p + "mlp.gate.expert_bias"], c)
        for e, weight in zip(chosen, w, strict=True):
            out[n] += weight * swiglu(x_ND[n], t, p + f"mlp.experts.{e}.")
    return out + swiglu(x_ND, t, p + "mlp.shared_experts.")


def attention(h_LD, t, p, c, mask_LL):
    L = h_LD.shape[0]
    H, G, Dh = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    qkv = h_LD @ t[p + "attention.query_key_value.weight"].T
    if c["use_qkv_bias"]:
        qkv = qkv + t[p + "attention.query_key_value.bias"]
    q, k, v = qkv.view(L, H + 2 * G, Dh).split([H, G, G], dim=1)
    q = rms(q, t[p + "attention.query_layernorm.weight"], c["rms_norm_eps"]).transpose(0, 1)
    k = rms(k, t[p + "attention.key_layernorm.weight"], c["rms_norm_eps"]).transpose(0, 1)
    rot, pos = int(Dh * c["partial_rotary_factor"]), torch.arange(L)
    q, k = rope(q, pos, rot, c["rope_theta"]), rope(k, pos, rot, c["rope_theta"])
    k, v = k.repeat_interleave(H // G, 0), v.transpose(0, 1).repeat_interleave(H // G, 0)
    att = (q @ k.transpose(1, 2)) / Dh ** 0.5
    att = att.masked_fill(~mask_LL, float("-inf")).softmax(-1)
    return (att @ v).transpose(0, 1).reshape(L, H * Dh) @ t[p + "attention.dense.weight"].T


def reference_logits(ids_L: torch.Tensor, t: dict, c: dict) -> torch.Tensor:
    """BailingMoeV2 forward of one sequence under the block-diffusion mask, [L, V]."""
    L, eps = ids_L.shape[0], c["rms_norm_eps"]
    block = torch.arange(L) // c["block_size"]
    mask_LL = block[None, :] <= block[:, None]
    x = t["model.word_embeddings.weight"][ids_L]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = x + attention(rms(x, t[p + "input_layernorm.weight"], eps), t, p, c, mask_LL)
        h = rms(x, t[p + "post_attention_layernorm.weight"], eps)
        x = x + (swiglu(h, t, p + "mlp.") if i < c["first_k_dense_replace"] else moe(h, t, p, c))
    return rms(x, t["model.norm.weight"], eps) @ t["lm_head.weight"].T
