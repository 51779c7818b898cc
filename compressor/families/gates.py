"""Head and MLP-unit gates: a buffer of per-group multipliers on a Linear's input, applied by a
forward pre-hook (a gate of 0 equals removing that head or unit). The hooks are found again by
what they are, so a deep copy of a gated model keeps working gates and no attribute is added."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn


def _gate_pre_hook(module: nn.Module, args: tuple, name: str) -> tuple:
    gate = getattr(module, name)
    (x, *rest) = args
    shape = x.shape
    x = (x.reshape(*shape[:-1], gate.numel(), -1) * gate.to(x.dtype)[:, None]).reshape(shape)
    return (x, *rest)


def install_gate(linear: nn.Linear, name: str, groups: int) -> torch.Tensor:
    """A gate of ones over `groups` equal slices of `linear`'s input, applied by a pre-hook."""
    if not hasattr(linear, name):
        ref = linear.weight
        linear.register_buffer(name, torch.ones(groups, dtype=ref.dtype, device=ref.device), persistent=False)
        linear.register_forward_pre_hook(partial(_gate_pre_hook, name=name))
    return getattr(linear, name)


def remove_gate(linear: nn.Linear, name: str) -> None:
    if hasattr(linear, name):
        for key, hook in list(linear._forward_pre_hooks.items()):
            if isinstance(hook, partial) and hook.func is _gate_pre_hook and hook.keywords.get("name") == name:
                del linear._forward_pre_hooks[key]
        del linear._buffers[name]
