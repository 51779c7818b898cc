"""In-tree Merger plugins: hydra (grouped-attention ensemble) and plain (physically pruned).

Registered by entry point (group `compressor.mergers`, see setup.cfg).
"""

from mergers.hydra import HydraMerger
from mergers.plain import PlainMerger, prune_physically

__all__ = ["HydraMerger", "PlainMerger", "prune_physically"]
