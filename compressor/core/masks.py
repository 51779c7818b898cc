"""Member masks: which attention heads (and, optionally, which MLP hidden units) a member keeps.

A mask is plain data (per block, one boolean vector over heads and optionally one over MLP units),
so it can be saved as JSON, inspected, and handed from a Pruner to a Merger without either knowing
the other.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from compressor.core.errors import MaskError
from compressor.core.io import atomic_write_text

__all__ = ["HeadMask", "MaskError", "load_masks", "save_masks"]


def _bools(blocks: Sequence) -> tuple[torch.Tensor, ...]:
    """Boolean vectors; numbers are accepted only when every value is 0 or 1 (no silent rounding)."""
    out = []
    for i, b in enumerate(blocks):
        t = torch.as_tensor(b)
        if t.dtype != torch.bool:
            if t.is_complex() or not bool(((t == 0) | (t == 1)).all()):
                raise MaskError(f"block {i}: a mask holds booleans (or 0/1), got values {t.flatten()[:6].tolist()}")
        out.append(t.to(torch.bool).flatten().clone())
    return tuple(out)


def _from_kept(kept: Sequence[Sequence[int]], sizes: Sequence[int]) -> tuple[torch.Tensor, ...]:
    blocks = []
    for idx, n in zip(kept, sizes):
        b = torch.zeros(n, dtype=torch.bool)
        b[list(idx)] = True
        blocks.append(b)
    return tuple(blocks)


def _check_kept(where: str, what: str, kept: list, sizes: list) -> None:
    if len(sizes) != len(kept):
        raise MaskError(f"{where}: '{what}' lists {len(kept)} blocks, expected {len(sizes)}")
    for i, (idx, n) in enumerate(zip(kept, sizes)):
        bad = [j for j in idx if not (isinstance(j, int) and not isinstance(j, bool) and 0 <= j < n)]
        if bad:
            raise MaskError(f"{where}: block {i} keeps {what} indices {bad}, expected 0..{n - 1}")


@dataclass(frozen=True)
class HeadMask:
    """Per attention block, a boolean vector over that block's heads (True = head kept), and
    optionally one over its MLP hidden units (`units`; None: every unit kept, or left to the merger)."""

    blocks: tuple[torch.Tensor, ...]
    units: tuple[torch.Tensor, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "blocks", _bools(self.blocks))
        if self.units is not None:
            object.__setattr__(self, "units", _bools(self.units))

    @classmethod
    def full(cls, heads_per_block: Sequence[int]) -> HeadMask:
        """A mask that keeps every head."""
        return cls(tuple(torch.ones(h, dtype=torch.bool) for h in heads_per_block))

    @classmethod
    def from_kept(cls, kept: Sequence[Sequence[int]], heads_per_block: Sequence[int]) -> HeadMask:
        """Build a mask from the indices of kept heads in each block."""
        return cls(_from_kept(kept, heads_per_block))

    def with_units(self, kept: Sequence[Sequence[int]], widths: Sequence[int]) -> HeadMask:
        """This mask keeping MLP units `kept[b]` (of `widths[b]`) in each block."""
        return HeadMask(self.blocks, _from_kept(kept, widths))

    def with_whole_blocks(self, count: int) -> HeadMask:
        """This mask keeping every head (and MLP unit) of its first `count` blocks."""
        whole = lambda parts: tuple(torch.ones_like(t) if b < count else t for b, t in enumerate(parts))  # noqa: E731
        return HeadMask(whole(self.blocks), None if self.units is None else whole(self.units))

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def heads_per_block(self) -> list[int]:
        return [int(b.numel()) for b in self.blocks]

    def num_kept(self) -> list[int]:
        return [int(b.sum()) for b in self.blocks]

    def kept_indices(self, block: int) -> list[int]:
        return torch.nonzero(self.blocks[block]).flatten().tolist()

    def kept_units(self, block: int) -> list[int]:
        """Indices of the MLP units kept in `block` (the mask must have units)."""
        return torch.nonzero(self.units[block]).flatten().tolist()

    def validate(
        self,
        heads_per_block: Sequence[int],
        allow_empty_blocks: bool = False,
        where: str = "mask",
        mlp_widths: Sequence[int] | None = None,
    ) -> None:
        """Raise MaskError unless this mask fits a model with `heads_per_block` heads (and, when
        the mask has units and `mlp_widths` is given, that many MLP units per block)."""
        if self.num_blocks != len(heads_per_block):
            raise MaskError(
                f"{where}: has {self.num_blocks} blocks, the model has {len(heads_per_block)} attention blocks"
            )
        for i, (b, h) in enumerate(zip(self.blocks, heads_per_block)):
            if b.numel() != h:
                raise MaskError(f"{where}: block {i} has {b.numel()} heads, the model has {h}")
            if not allow_empty_blocks and not bool(b.any()):
                raise MaskError(
                    f"{where}: block {i} keeps no head; keep at least one per block (or set allow_empty_blocks: true)"
                )
        if self.units is None or mlp_widths is None:
            return
        for i, (u, w) in enumerate(zip(self.units, mlp_widths)):
            if u.numel() != w:
                raise MaskError(f"{where}: block {i} has {u.numel()} MLP units, the model has {w}")
            if not bool(u.any()):
                raise MaskError(f"{where}: block {i} keeps no MLP unit")

    def _key(self) -> tuple:
        units = None if self.units is None else tuple(tuple(u.tolist()) for u in self.units)
        return tuple(tuple(b.tolist()) for b in self.blocks), units

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HeadMask) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def to_dict(self) -> dict:
        out = {"heads": self.heads_per_block(), "kept": [self.kept_indices(i) for i in range(self.num_blocks)]}
        if self.units is not None:
            out["mlp_units"] = [int(u.numel()) for u in self.units]
            out["mlp_kept"] = [self.kept_units(i) for i in range(self.num_blocks)]
        return out

    @classmethod
    def from_dict(cls, data: dict, where: str = "mask") -> HeadMask:
        try:
            heads, kept = data["heads"], data["kept"]
            _check_kept(where, "head", kept, heads)
            units = None
            if "mlp_kept" in data:
                _check_kept(where, "MLP unit", data["mlp_kept"], data["mlp_units"])
                units = _from_kept(data["mlp_kept"], data["mlp_units"])
            return cls(_from_kept(kept, heads), units)
        except (KeyError, TypeError) as e:
            raise MaskError(f"{where}: expected {{'heads': [int...], 'kept': [[int...]...]}}, got {e!r}") from e


def save_masks(path: str | os.PathLike, masks: Sequence[HeadMask]) -> None:
    """Write masks as JSON (atomically: a temporary file renamed into place)."""
    payload = {"format": "compressor.head_masks/1", "members": [m.to_dict() for m in masks]}
    atomic_write_text(Path(path), json.dumps(payload, indent=1))


def load_masks(path: str | os.PathLike) -> list[HeadMask]:
    """Read masks written by `save_masks`; errors name the file."""
    path = Path(path)
    try:
        payload = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise MaskError(f"{path}: no such mask file") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MaskError(f"{path}: not valid JSON ({e})") from e
    members = payload.get("members") if isinstance(payload, dict) else None
    if not isinstance(members, list):
        raise MaskError(f"{path}: expected a JSON object with a 'members' list")
    return [HeadMask.from_dict(m, where=f"{path}: members[{i}]") for i, m in enumerate(members)]
