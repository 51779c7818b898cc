"""Head masks: which attention heads each member keeps, per block.

A mask is plain data (one boolean vector per attention block), so it can be saved as JSON,
inspected, and handed from a Pruner to a Merger without either knowing the other.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from compressor.errors import MaskError
from compressor.io import atomic_write_text

__all__ = ["HeadMask", "MaskError", "load_masks", "save_masks"]


@dataclass(frozen=True)
class HeadMask:
    """Per attention block, a boolean vector over that block's heads (True = head kept)."""

    blocks: tuple[torch.Tensor, ...]

    def __post_init__(self) -> None:
        cleaned = tuple(torch.as_tensor(b, dtype=torch.bool).flatten().clone() for b in self.blocks)
        object.__setattr__(self, "blocks", cleaned)

    @classmethod
    def full(cls, heads_per_block: Sequence[int]) -> HeadMask:
        """A mask that keeps every head."""
        return cls(tuple(torch.ones(h, dtype=torch.bool) for h in heads_per_block))

    @classmethod
    def from_kept(cls, kept: Sequence[Sequence[int]], heads_per_block: Sequence[int]) -> HeadMask:
        """Build a mask from the indices of kept heads in each block."""
        blocks = []
        for idx, h in zip(kept, heads_per_block):
            b = torch.zeros(h, dtype=torch.bool)
            b[list(idx)] = True
            blocks.append(b)
        return cls(tuple(blocks))

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def heads_per_block(self) -> list[int]:
        return [int(b.numel()) for b in self.blocks]

    def num_kept(self) -> list[int]:
        return [int(b.sum()) for b in self.blocks]

    def kept_indices(self, block: int) -> list[int]:
        return torch.nonzero(self.blocks[block]).flatten().tolist()

    def validate(self, heads_per_block: Sequence[int], allow_empty_blocks: bool = False, where: str = "mask") -> None:
        """Raise MaskError unless this mask fits a model with `heads_per_block` heads."""
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

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HeadMask) or other.num_blocks != self.num_blocks:
            return False
        return all(a.shape == b.shape and bool((a == b).all()) for a, b in zip(self.blocks, other.blocks))

    def __hash__(self) -> int:
        return hash(tuple(tuple(b.tolist()) for b in self.blocks))

    def to_dict(self) -> dict:
        return {"heads": self.heads_per_block(), "kept": [self.kept_indices(i) for i in range(self.num_blocks)]}

    @classmethod
    def from_dict(cls, data: dict, where: str = "mask") -> HeadMask:
        try:
            heads, kept = data["heads"], data["kept"]
            if len(heads) != len(kept):
                raise MaskError(f"{where}: 'heads' and 'kept' list different numbers of blocks")
            for i, (idx, h) in enumerate(zip(kept, heads)):
                bad = [j for j in idx if not (isinstance(j, int) and 0 <= j < h)]
                if bad:
                    raise MaskError(f"{where}: block {i} keeps head indices {bad}, expected 0..{h - 1}")
            return cls.from_kept(kept, heads)
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
    except json.JSONDecodeError as e:
        raise MaskError(f"{path}: not valid JSON ({e})") from e
    members = payload.get("members") if isinstance(payload, dict) else None
    if not isinstance(members, list):
        raise MaskError(f"{path}: expected a JSON object with a 'members' list")
    return [HeadMask.from_dict(m, where=f"{path}: members[{i}]") for i, m in enumerate(members)]
