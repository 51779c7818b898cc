"""Where and in what precision a run computes: the recipe's `device` and `precision` keys.

`device: auto` is CUDA when available (under torchrun, the rank's local GPU), else the CPU.
`precision` is autocast around every forward pass of the run (training, scoring, evaluation,
prediction): `bf16` on the CPU (AVX-512 BF16 where the CPU has it) or a GPU, `fp16` on a GPU
(with gradient scaling when training); weights stay float32, so exports are float32.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from compressor.core.errors import InputError

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(name: str = "auto", key: str = "device") -> torch.device:
    """'auto' | 'cpu' | 'cuda' | 'cuda:N' -> a torch.device that exists on this machine; errors
    name `key` (the recipe key or command-line flag)."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as e:
        raise InputError(f"{key}: expected auto, cpu, cuda or cuda:N, got '{name}'") from e
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"{key}: '{name}' asked for, but no CUDA device is available (use cpu or auto)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise InputError(f"{key}: '{name}' asked for, but only {torch.cuda.device_count()} CUDA devices exist")
    elif device.type != "cpu":
        raise InputError(f"{key}: expected auto, cpu, cuda or cuda:N, got '{name}'")
    return device


CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86 AVX-512 BF16 / AMX, Arm BF16 (/proc/cpuinfo)


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool | None:
    """Whether this CPU computes bf16 natively (None when it cannot be told: no /proc/cpuinfo)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        if not path.is_file():
            return None
        cpuinfo = path.read_text(errors="replace")
    flags = {f for line in cpuinfo.splitlines() if line.startswith(("flags", "Features")) for f in line.split()}
    return any(f in flags for f in CPU_BF16_FLAGS)


def check_precision(precision: str, device: torch.device, native_bf16: bool | None = None) -> None:
    """A one-line error for a precision the device cannot run; a warning for bf16 on a CPU without
    native bf16, where autocast emulates it (a full MiniLM fine-tune step: 19 s against 0.9 s in fp32)."""
    if precision not in PRECISIONS:
        raise InputError(f"precision: expected one of {', '.join(PRECISIONS)}, got '{precision}'")
    if precision == "fp16" and device.type != "cuda":
        raise InputError("precision: fp16 autocast needs a CUDA device; use bf16 (or fp32) on the CPU")
    if precision == "bf16" and device.type == "cpu":
        native = cpu_has_native_bf16() if native_bf16 is None else native_bf16
        if native is False:
            warnings.warn(
                "precision: bf16 on a CPU without native bf16 (no AVX-512 BF16, AMX or Arm BF16): autocast "
                "emulates it, about 20x slower than fp32 here (a MiniLM fine-tune step took 19 s against 0.9 s); "
                "use precision: fp32",
                stacklevel=2,
            )


@contextlib.contextmanager
def precision_context(device: torch.device, precision: str) -> Iterator[None]:
    """Autocast to `precision` on `device` for everything run inside (nothing for fp32).

    Without autocast's weight cache: the context spans a whole step, training included, and the
    cache keeps the low-precision copy of each weight made at its first use until the outermost
    autocast exits, so every later forward would read the weights as they were then, whatever
    the optimiser or `load_state_dict` wrote since (a bf16 base trained against its initial
    weights reached 0.48 accuracy against 0.95 in fp32). Every forward casts the weights afresh."""
    dtype = PRECISIONS[precision]
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype, cache_enabled=False):
        yield


def fp16_autocast() -> bool:
    """True when running under CUDA fp16 autocast (training then scales the loss)."""
    return torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == torch.float16


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter (CPU for a model without parameters)."""
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work (for timing); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
