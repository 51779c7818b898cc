"""The model-family interface: the one place that knows a model family's attribute names.

A `Family` wraps one model and answers everything the rest of compressor asks of it: its
attention blocks and each head's weights, its MLPs, norms and layer scales, how to gate heads and
how to remove heads or MLP units, how to run it and read logits from its output, its embedding
"stem" and classifier "head" as standalone modules (for code that runs the blocks itself, such as
a fused ensemble), and how to describe the architecture for an export and build it again. It
knows no merger. A new family is one subclass in one file, registered by name.

Head gating is a forward pre-hook on each block's attention output projection: the projection's
input is the concatenation of the heads' outputs, so multiplying head h's slice by gate[h] is
exactly "this head's output is scaled by gate[h]". A gate of 0 equals removing the head.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
from torch import nn

from compressor.core.errors import MaskError, UnsupportedModelError
from compressor.core.masks import HeadMask
from compressor.families.gates import install_gate, remove_gate
from compressor.families.parts import (
    AttentionSlots,
    BlockParts,
    HeadWeights,
    MlpSlots,
    head_columns,
    select_cols,
    select_rows,
)


class Family(ABC):
    """Family-specific access to one model (see the module docstring)."""

    name: ClassVar[str] = ""
    pre_norm: ClassVar[bool] = True  # x + attn(norm1(x)); post-norm: norm1(x + attn(x))
    causal: ClassVar[bool] = False  # attention sees only earlier tokens (CLIP text)

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    # --- what each family provides ----------------------------------------------------------
    @classmethod
    @abstractmethod
    def matches(cls, model: nn.Module) -> bool:
        """True if this family handles `model`."""

    @abstractmethod
    def blocks(self) -> Sequence[nn.Module]:
        """The transformer blocks, in order."""

    @abstractmethod
    def attention(self, block: int) -> AttentionSlots: ...

    @abstractmethod
    def head_dim(self, block: int) -> int: ...

    @abstractmethod
    def set_head_count(self, block: int, heads: int) -> None:
        """After surgery: set every attribute the block's forward reads (num_heads, all_head_size, ...)."""

    @abstractmethod
    def mlp(self, block: int) -> MlpSlots: ...

    @abstractmethod
    def block_parts(self, block: int) -> BlockParts: ...

    @abstractmethod
    def activation(self) -> str:
        """The MLP activation by name (gelu, gelu_tanh, quick_gelu, relu, silu)."""

    @abstractmethod
    def classifier(self) -> nn.Module:
        """The classification head (what `train_base: {trainable: head}` trains)."""

    @abstractmethod
    def describe(self) -> dict:
        """JSON-able architecture of the unpruned model: enough for `empty` to build it again."""

    @classmethod
    @abstractmethod
    def empty(cls, arch: dict, depth: int | None = None) -> nn.Module:
        """A freshly built model of architecture `arch` (with `depth` blocks when given)."""

    def standard_block_problems(self) -> list[str]:
        """Why this model's blocks are not the standard pre-norm transformer block (LayerNorm,
        multi-head attention, MLP with a supported activation, optional LayerScale) that code
        re-implementing the blocks assumes; empty when they are."""
        return []

    def input_size(self) -> tuple[int, ...] | None:
        """The input an image model takes, (channels, height, width); None when not an image model."""
        return None

    def stem_and_head(self) -> tuple[nn.Module, nn.Module]:
        """Copies of the model's stem and head as standalone modules:
        stem(inputs) -> (tokens [B, T, D], key_mask [B, T] bool or None), with
        stem.tokens_per_sample(inputs) -> T, and head(tokens [N, T, D], key_mask or None) -> logits [N, C]."""
        raise UnsupportedModelError(f"{type(self).__name__} does not expose its stem and head")

    def tokens_per_sample(self, inputs: torch.Tensor) -> int:
        """How many tokens the blocks see per input sample (for FLOPs budgets)."""
        return self.stem_and_head()[0].tokens_per_sample(inputs)

    def save_pretrained(self, folder: Any, mask: HeadMask) -> str | None:
        """Write a copy that the model's own library loads without compressor; return its folder
        name, or None when the family has no such format."""
        return None

    def standalone(self) -> dict:
        """What a user of the model's own library needs, beside the weights, to rebuild this
        (pruned) model without compressor; recorded in a plain export's config.json."""
        return {}

    # --- running ----------------------------------------------------------------------------
    def logits(self, inputs: Any) -> torch.Tensor:
        """Run the model on one batch (moved to the model's device) and return class logits [B, C]."""
        device = next(self.model.parameters()).device
        if isinstance(inputs, dict):
            return self.output_logits(self.model(**{k: v.to(device) for k, v in inputs.items()}))
        return self.output_logits(self.model(inputs.to(device)))

    @staticmethod
    def output_logits(output: Any) -> torch.Tensor:
        """Logits from the model's output: the tensor itself, or its `logits` (a bare encoder:
        its last hidden state)."""
        for name in ("logits", "last_hidden_state"):
            if hasattr(output, name):
                return getattr(output, name)
        return output

    # --- structure, from the slots ----------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self.blocks())

    def num_heads(self, block: int) -> int:
        slots = self.attention(block)
        rows = sum(s.get().out_features for s in slots.qkv)
        return rows // (3 * self.head_dim(block))

    def heads_per_block(self) -> list[int]:
        return [self.num_heads(b) for b in range(self.num_blocks)]

    def output_projection(self, block: int) -> nn.Linear:
        return self.attention(block).o.get()

    def head_weights(self, block: int) -> HeadWeights:
        slots = self.attention(block)
        h, hd = self.num_heads(block), self.head_dim(block)
        lins = [s.get() for s in slots.qkv]
        if len(lins) == 1:
            w = lins[0].weight.view(3, h, hd, -1)
            b = None if lins[0].bias is None else lins[0].bias.view(3, h, hd)
            ws, bs = list(w.unbind(0)), [None] * 3 if b is None else list(b.unbind(0))
        else:
            ws = [li.weight.view(h, hd, -1) for li in lins]
            bs = [None if li.bias is None else li.bias.view(h, hd) for li in lins]
        o = slots.o.get()
        return HeadWeights(*ws, *bs, o=o.weight.view(-1, h, hd), o_bias=o.bias)

    def mlp_widths(self) -> list[int]:
        return [self.mlp(b).fc1.get().out_features for b in range(self.num_blocks)]

    # --- gating -----------------------------------------------------------------------------
    def install_gates(self) -> list[torch.Tensor]:
        """Give every block a head gate of ones (idempotent); return the gate tensors."""
        return [install_gate(self.output_projection(b), "head_gate", self.num_heads(b)) for b in range(self.num_blocks)]

    def install_unit_gates(self) -> list[torch.Tensor]:
        """Give every block's MLP a unit gate of ones on fc2's input (idempotent); return them."""
        return [install_gate(self.mlp(b).fc2.get(), "unit_gate", w) for b, w in enumerate(self.mlp_widths())]

    def remove_gates(self) -> None:
        """Remove every head and MLP-unit gate (hooks and buffers)."""
        for b in range(self.num_blocks):
            remove_gate(self.output_projection(b), "head_gate")
            remove_gate(self.mlp(b).fc2.get(), "unit_gate")

    def set_gates(self, gates: Sequence[torch.Tensor]) -> None:
        """Replace the head-gate tensors (for example with ones that require grad)."""
        self.install_gates()
        for b, g in enumerate(gates):
            self.output_projection(b)._buffers["head_gate"] = g

    def apply_mask(self, mask: HeadMask | None) -> None:
        """Gate heads (and MLP units, when the mask has them) by `mask`; None keeps everything."""
        mask = mask or HeadMask.full(self.heads_per_block())
        mask.validate(self.heads_per_block(), allow_empty_blocks=True, mlp_widths=self.mlp_widths())
        ref = self.output_projection(0).weight
        self.set_gates([b.to(dtype=ref.dtype, device=ref.device) for b in mask.blocks])
        if mask.units is not None or any(hasattr(self.mlp(b).fc2.get(), "unit_gate") for b in range(self.num_blocks)):
            gates = self.install_unit_gates()
            units = mask.units or [torch.ones(g.numel(), dtype=torch.bool) for g in gates]
            for g, u in zip(gates, units):
                g.copy_(u.to(g.dtype))

    @contextmanager
    def gates_restored(self, requires_grad: bool = False) -> Iterator[list[torch.Tensor]]:
        """Working copies of the head gates, installed and yielded (set `requires_grad` to take
        gradients through them); every head and MLP-unit gate is put back as it was afterwards."""
        had_units = any(hasattr(self.mlp(b).fc2.get(), "unit_gate") for b in range(self.num_blocks))
        heads = [g.detach().clone() for g in self.install_gates()]
        units = [g.detach().clone() for g in self.install_unit_gates()] if had_units else None
        working = [g.clone().requires_grad_(requires_grad) for g in heads]
        self.set_gates(working)
        try:
            yield working
        finally:
            self.set_gates(heads)
            if units is None:
                for b in range(self.num_blocks):
                    remove_gate(self.mlp(b).fc2.get(), "unit_gate")
            else:
                for g, u in zip(self.install_unit_gates(), units):
                    g.copy_(u)

    @contextmanager
    def masked(self, mask: HeadMask | None) -> Iterator[None]:
        """Run the model with `mask` applied; every gate is restored afterwards."""
        with self.gates_restored():
            self.apply_mask(mask)
            yield

    # --- surgery ----------------------------------------------------------------------------
    def prune_heads_(self, block: int, keep: Sequence[int]) -> None:
        """Physically keep only heads `keep` of `block` (in place); gates follow their heads."""
        slots = self.attention(block)
        h, hd = self.num_heads(block), self.head_dim(block)
        keep_t = torch.as_tensor(sorted(keep), dtype=torch.long)
        if keep_t.numel() == 0:
            raise MaskError(f"block {block}: cannot physically remove every head")
        cols = head_columns(keep_t, hd)
        proj = slots.o.get()
        gate_values = proj.head_gate[keep_t].clone() if hasattr(proj, "head_gate") else None
        if len(slots.qkv) == 1:  # fused [q; k; v] rows
            slots.qkv[0].set(select_rows(slots.qkv[0].get(), torch.cat([cols + i * h * hd for i in range(3)])))
        else:
            for s in slots.qkv:
                s.set(select_rows(s.get(), cols))
        for s in slots.head_rows:
            s.set(select_rows(s.get(), cols))
        slots.o.set(select_cols(proj, cols))
        self.set_head_count(block, int(keep_t.numel()))
        if gate_values is not None:
            install_gate(self.output_projection(block), "head_gate", int(keep_t.numel()))
            self.output_projection(block)._buffers["head_gate"] = gate_values

    def prune_mlp_units_(self, block: int, keep: Sequence[int]) -> None:
        """Physically keep only MLP hidden units `keep` of `block` (in place)."""
        slots = self.mlp(block)
        keep_t = torch.as_tensor(sorted(keep), dtype=torch.long)
        if keep_t.numel() == 0:
            raise MaskError(f"block {block}: cannot physically remove every MLP unit")
        fc2 = slots.fc2.get()
        gate_values = fc2.unit_gate[keep_t].clone() if hasattr(fc2, "unit_gate") else None
        slots.fc1.set(select_rows(slots.fc1.get(), keep_t))
        slots.fc2.set(select_cols(fc2, keep_t))
        if gate_values is not None:
            install_gate(self.mlp(block).fc2.get(), "unit_gate", int(keep_t.numel()))
            self.mlp(block).fc2.get()._buffers["unit_gate"] = gate_values
