"""The process group: who this process is under `torchrun`, its device, and collectives on CPU
tensors that are no-ops in a single process.

gloo on CPU, NCCL on GPUs. Nothing here knows about models or optimizers (`parallel.py` does).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from clover.engine.llm import resolve_device as engine_device


@dataclass
class DistEnv:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @classmethod
    def from_environ(cls) -> DistEnv:
        """torchrun's RANK / WORLD_SIZE / LOCAL_RANK (a single process when unset)."""
        env = os.environ
        return cls(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)),
                   int(env.get("LOCAL_RANK", 0)))

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device(name: str, env: DistEnv) -> torch.device:
    """The engine's device rule, with each process of a distributed run on its own GPU."""
    device = engine_device(name)
    return torch.device(f"cuda:{env.local_rank}") if device.type == "cuda" else device


def init_distributed(env: DistEnv, device: torch.device) -> None:
    if env.world > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")


def close_distributed() -> None:
    """Leave the process group cleanly: wait for every rank, then destroy it.

    A rank that tears gloo down while a peer still talks to it can abort the peer
    ("terminate called without an active exception"), so all ranks meet first."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def barrier(env: DistEnv) -> None:
    if env.world > 1:
        dist.barrier()


def all_reduce_sum(t: torch.Tensor, env: DistEnv) -> torch.Tensor:
    if env.world > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t
