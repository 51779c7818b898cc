"""In-tree Pruner plugins and head importances.

Pruners (selection): magnitude, taylor, gradient_free (circuit), topk (any importance), random,
disjoint, file. Importances (scores): magnitude, taylor, gradient_free. All are registered by
entry point (groups `compressor.pruners` and `compressor.importances`, see setup.cfg).
"""

from pruners.disjoint import DisjointPruner
from pruners.from_file import MaskFilePruner
from pruners.gradient_free import CircuitImportance, GradientFreePruner
from pruners.magnitude import MagnitudeImportance, MagnitudePruner
from pruners.random import RandomPruner
from pruners.taylor import TaylorImportance, TaylorPruner
from pruners.topk import TopKPruner

__all__ = [
    "CircuitImportance",
    "DisjointPruner",
    "GradientFreePruner",
    "MagnitudeImportance",
    "MagnitudePruner",
    "MaskFilePruner",
    "RandomPruner",
    "TaylorImportance",
    "TaylorPruner",
    "TopKPruner",
]
