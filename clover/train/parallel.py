"""Data-parallel strategies for the training loop: DDP (a whole model per process) and FSDP2
(`fully_shard` per transformer block, parameters, gradients and optimizer state sharded).

A strategy shards the model before the optimizer is built, wraps the objective after a resume,
switches gradient sync off for all but the last micro-batch, clips by the global norm, and hands
back the full weights on the main process. Both reduce gradients as a mean over processes, so the
loop's loss scaling is the same for both and so is every update. torch does the sharding and the
collectives; nothing here is home-made.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

import torch
from torch import nn

from clover.model import CloverModel
from clover.train.distributed import DistEnv


class Parallel(Protocol):
    sharded: bool  # checkpoints through torch.distributed.checkpoint (resharded on load)
    shares_prefix: bool  # the objective may run a common prompt prefix once, through a cache

    def shard(self, model: CloverModel, env: DistEnv, device: torch.device,
              bf16: bool) -> None: ...
    def wrap(self, module: nn.Module, model: CloverModel, env: DistEnv,
             device: torch.device) -> nn.Module: ...
    def sync(self, net: nn.Module, model: CloverModel, enabled: bool): ...
    def clip(self, model: CloverModel, max_norm: float) -> float: ...
    def full_state(self, model: CloverModel, env: DistEnv) -> dict[str, torch.Tensor] | None: ...


def _grads(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.grad is not None]


def frozen_linears_to_bf16(model: nn.Module) -> int:
    """Store the frozen weights and biases of `nn.Linear` layers (a LoRA's base) in bf16 for a
    bf16-autocast run: autocast gives every matmul the same bf16 values anyway, so each forward
    is spared casting ~100M parameters (and their backward keeps the bf16 copies). Trained
    parameters, and frozen ones read outside a matmul (norms, embeddings), stay as they are.
    Returns how many tensors changed."""
    n = 0
    for module in model.modules():
        if type(module) is not nn.Linear:
            continue
        for p in (module.weight, module.bias):
            if p is not None and not p.requires_grad and p.dtype == torch.float32:
                p.data = p.data.to(torch.bfloat16)
                n += 1
    return n


class DDP:
    """torch DistributedDataParallel over the objective module (nothing to do in one process)."""

    sharded = False
    shares_prefix = True

    def shard(self, model: CloverModel, env: DistEnv, device: torch.device, bf16: bool) -> None:
        if bf16:
            frozen_linears_to_bf16(model)

    def wrap(self, module: nn.Module, model: CloverModel, env: DistEnv,
             device: torch.device) -> nn.Module:
        if env.world == 1:
            return module
        ids = [device.index] if device.type == "cuda" else None
        # Experts that get no token on one rank have no gradient there: DDP must look for them.
        return nn.parallel.DistributedDataParallel(
            module, device_ids=ids, find_unused_parameters=model.config.is_moe)

    def sync(self, net: nn.Module, model: CloverModel, enabled: bool):
        if enabled or not isinstance(net, nn.parallel.DistributedDataParallel):
            return contextlib.nullcontext()
        return net.no_sync()

    def clip(self, model: CloverModel, max_norm: float) -> float:
        return float(torch.nn.utils.clip_grad_norm_(_grads(model), max_norm))

    def full_state(self, model: CloverModel, env: DistEnv) -> dict[str, torch.Tensor] | None:
        return model.state_dict() if env.is_main else None


class FSDP:
    """FSDP2: each transformer block is sharded as two `fully_shard` units, its attention and its
    FFN / MoE, and the root (embeddings, norms, head) is one more; bf16 runs gather parameters in
    bf16 and reduce gradients in fp32. In a single process there is nothing to shard and the plain
    model trains (checkpoints stay sharded-format, so a run can move between world sizes).

    Why not the Block itself: FSDP2 rebuilds the containers among a unit's inputs, and a Block
    appends its MoE routing stats to a list it is handed, so the appends would land in a copy."""

    sharded = True
    # FSDP2 gathers a block's weights for backward when gradient reaches the block's outputs; a
    # shared-prefix KV cache carries gradient into the prefix pass around them, so every row
    # recomputes its prefix instead (same loss and gradients, more compute).
    shares_prefix = False

    def __init__(self) -> None:
        self.active = False

    def shard(self, model: CloverModel, env: DistEnv, device: torch.device, bf16: bool) -> None:
        if env.world == 1:
            return
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(device.type, (env.world,))
        mp = MixedPrecisionPolicy()
        if bf16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ValueError("--bf16: this GPU has no bfloat16; train in fp32 (drop --bf16)")
        if bf16:
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.layers:
            fully_shard(block.attn, mesh=mesh, mp_policy=mp)
            fully_shard(block.ffn, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        self.active = True

    def wrap(self, module: nn.Module, model: CloverModel, env: DistEnv,
             device: torch.device) -> nn.Module:
        return module  # the hooks live on the sharded model itself

    def sync(self, net: nn.Module, model: CloverModel, enabled: bool):
        if self.active:  # accumulate unsharded gradients; reduce-scatter on the last micro-batch
            model.set_requires_gradient_sync(enabled)
        return contextlib.nullcontext()

    def clip(self, model: CloverModel, max_norm: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(_grads(model), max_norm)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def full_state(self, model: CloverModel, env: DistEnv) -> dict[str, torch.Tensor] | None:
        """Every rank must call this (it all-gathers); the main process gets CPU tensors."""
        if not self.active:
            return model.state_dict() if env.is_main else None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(model, options=options)
        return state if env.is_main else None


PARALLEL: dict[str, type[DDP] | type[FSDP]] = {"ddp": DDP, "fsdp": FSDP}


def full_model(state: dict[str, torch.Tensor], model: CloverModel) -> CloverModel:
    """A plain (unsharded) model holding `state`, built on the meta device and assigned."""
    from clover.model import build_model

    plain = build_model(model.config, device="meta")
    plain.load_state_dict(state, assign=True, strict=True)
    return plain
