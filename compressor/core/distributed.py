"""torch.distributed helpers: sampling, reductions and gathers that are no-ops in one process.

Data is sharded with torch's `DistributedSampler`: rank r reads the samples at positions
r, r + N, r + 2N, ... of the (seeded, optionally shuffled) order, so with a local batch of
`batch_size / N` the N local batches of one step are exactly the global batch one process reads.
The sampler pads the order to a multiple of N by repeating its first samples; those padding
samples are weighted out of losses and sums and dropped from gathered predictions, so a run on N
processes computes what one process computes, to float tolerance. The backend follows the device:
NCCL on GPUs, gloo on the CPU.
"""

from __future__ import annotations

import math
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, DistributedSampler

from compressor.core.errors import OptionError

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
        raise OptionError(f"distributed.backend: expected one of {', '.join(BACKENDS)}, got '{backend}'")
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


def sampler(ds: Dataset, shuffle: bool = False, seed: int = 0, epoch: int = 0) -> DistributedSampler:
    """This rank's `DistributedSampler` over `ds` (one replica in a single process: every sample, in order)."""
    s = DistributedSampler(ds, num_replicas=world_size(), rank=rank(), shuffle=shuffle, seed=seed, drop_last=False)
    s.set_epoch(epoch)
    return s


def local_batch_size(batch_size: int) -> int:
    """Per-rank batch size for a global `batch_size` (exactly global / N when N divides it)."""
    return max(1, math.ceil(batch_size / world_size()))


def real_samples(n: int) -> int:
    """How many of this rank's sampler positions hold real samples of a dataset of `n` (the rest
    are the sampler's padding, always at the end of the rank's order)."""
    r, w = rank(), world_size()
    return len(range(r, n, w))


def _on_comm_device(t: torch.Tensor) -> torch.Tensor:
    """`t` where the backend communicates: NCCL only moves CUDA tensors, gloo CPU ones."""
    if dist.get_backend() == "nccl":
        return t.cuda() if t.device.type != "cuda" else t
    return t.cpu() if t.device.type != "cpu" else t


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of `t` over ranks (in place; returned for chaining)."""
    if is_distributed():
        x = _on_comm_device(t)
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
        if x is not t:
            t.copy_(x)
    return t


def gather_sampled(t: torch.Tensor, n: int, dim: int = 0) -> torch.Tensor:
    """Every rank's per-sample results along `dim` (the rank's full sampler order, padding
    included) -> the results for samples 0..n-1 in dataset order, on every rank.

    Sampler position p = r + N*j sits at index j of rank r, so stacking the ranks after `dim`
    and flattening restores the order; the padding is then cut off.
    """
    if not is_distributed():
        return t.narrow(dim, 0, n)
    x = _on_comm_device(t.contiguous())
    parts = [torch.empty_like(x) for _ in range(world_size())]
    dist.all_gather(parts, x)
    return torch.stack(parts, dim=dim + 1).flatten(dim, dim + 1).narrow(dim, 0, n).to(t.device)


def gather_varlen(t: torch.Tensor) -> torch.Tensor:
    """Every rank's 1-D tensor `t` (lengths may differ), concatenated in rank order, on every rank."""
    if not is_distributed():
        return t
    sizes = [_on_comm_device(torch.zeros(1, dtype=torch.long)) for _ in range(world_size())]
    dist.all_gather(sizes, _on_comm_device(torch.tensor([t.numel()], dtype=torch.long)))
    longest = int(max(s.item() for s in sizes))
    padded = _on_comm_device(torch.zeros(longest, dtype=t.dtype))
    padded[: t.numel()] = t
    parts = [torch.empty_like(padded) for _ in range(world_size())]
    dist.all_gather(parts, padded)
    return torch.cat([p[: int(n.item())] for p, n in zip(parts, sizes)]).to(t.device)


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
