"""torch.distributed helpers: data sharding, reductions and gathers that are no-ops in one process.

Every rank holds the same global batches (same seeds, same order) and works on its contiguous
slice of each one (`shard`); results are summed (`all_reduce_sum`) or gathered back in order
(`gather_cat`), so a run on N processes computes what one process computes, to float tolerance.
The backend follows the device: NCCL on GPUs, gloo on the CPU.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

BACKENDS = ("auto", "gloo", "nccl")


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    """True on the process that writes outputs (rank 0, or the only process)."""
    return rank() == 0


def resolve_backend(backend: str = "auto") -> str:
    if backend not in BACKENDS:
        raise ValueError(f"distributed.backend: expected one of {', '.join(BACKENDS)}, got '{backend}'")
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
    return backend


def init_from_env(backend: str = "auto", timeout_s: int = 1800) -> bool:
    """Join the process group torchrun describes (WORLD_SIZE > 1); return whether distributed."""
    if is_distributed():
        return True
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    backend = resolve_backend(backend)
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return True


def shard(batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """This rank's contiguous slice of every tensor of a global batch."""
    if not is_distributed():
        return batch
    return tuple(torch.tensor_split(t, world_size())[rank()] for t in batch)


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of `t` over ranks (in place; returned for chaining)."""
    if is_distributed():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def gather_cat(t: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Concatenate every rank's `t` along `dim` in rank order (slices may differ in size)."""
    if not is_distributed():
        return t
    t = t.contiguous()
    size = torch.tensor([t.shape[dim]], dtype=torch.long)
    sizes = [torch.zeros_like(size) for _ in range(world_size())]
    dist.all_gather(sizes, size)
    longest = int(max(s.item() for s in sizes))
    pad = [0, 0] * (t.dim() - 1 - dim) + [0, longest - t.shape[dim]]
    padded = torch.nn.functional.pad(t, pad) if longest > t.shape[dim] else t
    parts = [torch.empty_like(padded) for _ in range(world_size())]
    dist.all_gather(parts, padded)
    return torch.cat([p.narrow(dim, 0, int(s.item())) for p, s in zip(parts, sizes)], dim=dim)


def all_true(flag: bool) -> bool:
    """True only if `flag` is true on every rank (so all ranks take the same branch)."""
    t = torch.tensor([0 if flag else 1], dtype=torch.long)
    return int(all_reduce_sum(t).item()) == 0


def shutdown() -> None:
    """Leave the process group, if this process joined one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if is_distributed():
        dist.barrier()
