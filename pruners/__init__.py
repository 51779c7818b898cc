"""In-tree Pruner plugins: magnitude, taylor, gradient_free (circuit), random, disjoint."""

from pruners.base import Pruner, make_distinct
from pruners.disjoint import DisjointPruner
from pruners.from_file import MaskFilePruner
from pruners.gradient_free import GradientFreePruner
from pruners.magnitude import MagnitudePruner
from pruners.random import RandomPruner
from pruners.scored import ScoredPruner
from pruners.taylor import TaylorPruner

__all__ = [
    "DisjointPruner",
    "MaskFilePruner",
    "GradientFreePruner",
    "MagnitudePruner",
    "Pruner",
    "RandomPruner",
    "ScoredPruner",
    "TaylorPruner",
    "make_distinct",
]
