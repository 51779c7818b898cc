"""The model adapter interface: the one place that knows a model family's attribute names.

Pruners and mergers talk only to an adapter. An adapter lists the attention blocks, exposes each
head's weights, gates heads in the forward pass and removes heads physically.

Head gating is a forward pre-hook on each block's attention output projection: the projection's
input is the concatenation of the heads' outputs, so multiplying head h's slice by gate[h] is
exactly "this head's output is scaled by gate[h]". A gate of 0 equals removing the head.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from compressor.masks import HeadMask


def _gate_pre_hook(module: nn.Module, args: tuple) -> tuple:
    gate = module.head_gate
    (x, *rest) = args
    shape = x.shape
    x = (x.reshape(*shape[:-1], gate.numel(), -1) * gate.to(x.dtype)[:, None]).reshape(shape)
    return (x, *rest)


@dataclass
class HeadWeights:
    """One block's attention weights split per head.

    q, k, v: [H, head_dim, D] weights and [H, head_dim] biases (None where absent);
    o: [D, H, head_dim] output-projection weight, o_bias: [D] or None.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q_bias: torch.Tensor | None
    k_bias: torch.Tensor | None
    v_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None


class ModelAdapter(ABC):
    """Family-specific access to a transformer's attention heads."""

    family: str = ""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    # --- structure -------------------------------------------------------------------------
    @property
    @abstractmethod
    def num_blocks(self) -> int: ...

    @abstractmethod
    def num_heads(self, block: int) -> int: ...

    @abstractmethod
    def head_dim(self, block: int) -> int: ...

    @abstractmethod
    def output_projection(self, block: int) -> nn.Linear:
        """The Linear that maps the concatenated head outputs of `block` back to the stream."""

    @abstractmethod
    def head_weights(self, block: int) -> HeadWeights: ...

    @abstractmethod
    def prune_heads_(self, block: int, keep: Sequence[int]) -> None:
        """Physically keep only heads `keep` in `block` (in place)."""

    @abstractmethod
    def logits(self, inputs: Any) -> torch.Tensor:
        """Run the model on one batch of inputs and return class logits [B, C]."""

    def heads_per_block(self) -> list[int]:
        return [self.num_heads(b) for b in range(self.num_blocks)]

    # --- gating ----------------------------------------------------------------------------
    def install_gates(self) -> list[torch.Tensor]:
        """Give every block a head gate of ones (idempotent); return the gate tensors."""
        gates = []
        for b in range(self.num_blocks):
            proj = self.output_projection(b)
            if not hasattr(proj, "head_gate"):
                ref = proj.weight
                proj.register_buffer(
                    "head_gate", torch.ones(self.num_heads(b), dtype=ref.dtype, device=ref.device), persistent=False
                )
                proj._compressor_gate_hook = proj.register_forward_pre_hook(_gate_pre_hook)
            gates.append(proj.head_gate)
        return gates

    def remove_gates(self) -> None:
        for b in range(self.num_blocks):
            proj = self.output_projection(b)
            if hasattr(proj, "head_gate"):
                proj._compressor_gate_hook.remove()
                del proj._compressor_gate_hook
                del proj._buffers["head_gate"]

    def set_gates(self, gates: Sequence[torch.Tensor]) -> None:
        """Replace the gate tensors (for example with ones that require grad)."""
        self.install_gates()
        for b, g in enumerate(gates):
            self.output_projection(b)._buffers["head_gate"] = g

    def apply_mask(self, mask: HeadMask | None) -> None:
        """Gate heads by `mask` (None: keep every head)."""
        mask = mask or HeadMask.full(self.heads_per_block())
        mask.validate(self.heads_per_block(), allow_empty_blocks=True)
        ref = self.output_projection(0).weight
        self.set_gates([b.to(dtype=ref.dtype, device=ref.device) for b in mask.blocks])

    def current_mask(self) -> HeadMask:
        gates = self.install_gates()
        return HeadMask(tuple(g.detach() != 0 for g in gates))
