"""A third-party Pruner plugin, as a user would write it in their own package."""

from compressor.core.masks import HeadMask
from pruners.base import Pruner


class KeepFirstHeads(Pruner):
    """Keep the first n heads of every block; member i shifts the window by i heads."""

    def __init__(self, n: int = 2, **kwargs) -> None:
        super().__init__(**kwargs)
        self.n = n

    def prune(self, adapter, calibration, heldout=None):
        masks = []
        for i in range(self.members):
            kept = [[(i + j) % h for j in range(self.n)] for h in adapter.heads_per_block()]
            masks.append(HeadMask.from_kept(kept, adapter.heads_per_block()))
        return self.check(masks, adapter)
