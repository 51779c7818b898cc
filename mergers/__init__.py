"""In-tree Merger plugins: hydra (grouped-attention ensemble) and plain (physically pruned)."""

from mergers.base import Merger
from mergers.hydra import HydraMerger
from mergers.plain import PlainMerger, prune_physically

__all__ = ["HydraMerger", "Merger", "PlainMerger", "prune_physically"]
