"""The interfaces plugins implement: Pruner (head selection), Importance (head scores), Merger.

They live in the core so that it can check what a recipe names (an import path must be a
subclass of the kind its key asks for) without importing any plugin package. This project's own
plugins (the `pruners` and `mergers` packages) and third-party ones subclass these the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from compressor.core.errors import MaskError, OptionError
from compressor.core.masks import HeadMask
from compressor.core.schema import Field, validate_mapping

if TYPE_CHECKING:
    from compressor.families.base import Family

Batch = tuple[torch.Tensor, ...]


class Importance:
    """Scores every attention head of a model: one tensor per block, higher = more important.

    Importance is separate from selection (as in torch-pruning): a pruner turns scores into masks.
    """

    needs_data: bool = True  # False: scores come from the weights alone (members differ by jitter)

    def __call__(
        self,
        family: Family,
        calibration: Sequence[Batch],
        heldout: Sequence[Batch] | None = None,
        outliers: Sequence[torch.Tensor] | None = None,
        keep: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        """Per block, one score per head. `outliers`: batches of validation outlier inputs (for
        uncertainty objectives). `keep(block_scores) -> bool mask` is the pruner's selection for
        one block, for importances that prune as they go (greedy, block by block); None keeps
        every head."""
        raise NotImplementedError


MAX_MEMBERS = 64


def _ratios(v: Any) -> str | None:
    ratios = v if isinstance(v, list) else [v]
    ok = all(isinstance(r, (int, float)) and not isinstance(r, bool) and 0.0 <= r <= 1.0 for r in ratios)
    return None if ok else "a number in [0, 1] (or a list of them, one per member)"


PRUNER_OPTIONS = {
    "members": Field((int,), 3, check=lambda v: None if 1 <= v <= MAX_MEMBERS else f"an integer in 1..{MAX_MEMBERS}"),
    "keep_ratio": Field((int, float, list), 0.5, check=_ratios),
    "keep_heads": Field((int, type(None)), None),
    "seed": Field((int,), 0),
    "distinct": Field((bool,), True),
    "allow_empty_blocks": Field((bool,), False),
}


def checked_options(given: dict[str, Any], schema: dict[str, Field]) -> dict[str, Any]:
    """A plugin's own options checked against its schema (one idiom for every option block): a
    failure is a one-line OptionError naming the key; the prune step adds the recipe's place."""
    return validate_mapping("", "", given, schema, error=OptionError)


class Pruner:
    """Returns M head masks (one per ensemble member) for a model seen through its family.

    Subclasses implement `prune(family, calibration, heldout)`. The options every pruner takes:
    `members`, `keep_ratio` (one, or one per member) or `keep_heads`, `seed`, `diversity`
    (how members are made to differ; the choices depend on the pruner), `distinct` and
    `allow_empty_blocks`.
    """

    diversity_choices: tuple[str, ...] = ("none",)
    keep_ratio_selects_heads: bool = True  # False where keep_ratio means something else (disjoint shares, files)

    def __init__(
        self,
        members: int = 3,
        keep_ratio: float | list[float] = 0.5,
        keep_heads: int | None = None,
        seed: int = 0,
        diversity: str | None = None,
        distinct: bool = True,
        allow_empty_blocks: bool = False,
    ) -> None:
        given = {
            "members": members,
            "keep_ratio": keep_ratio,
            "keep_heads": keep_heads,
            "seed": seed,
            "distinct": distinct,
            "allow_empty_blocks": allow_empty_blocks,
        }
        choices = self.diversity_choices
        diversity_field = Field(
            (str, type(None)), None, check=lambda v: None if v in (None, *choices) else f"one of {', '.join(choices)}"
        )
        options = checked_options({**given, "diversity": diversity}, {**PRUNER_OPTIONS, "diversity": diversity_field})
        self.members = options["members"]
        ratios = (
            options["keep_ratio"] if isinstance(options["keep_ratio"], list) else [options["keep_ratio"]] * self.members
        )
        if len(ratios) != self.members:
            raise OptionError(f"keep_ratio: expected one ratio or a list of {self.members} (one per member)")
        self.keep_ratios = [float(r) for r in ratios]
        self.keep_heads = options["keep_heads"]
        every_head = options["keep_heads"] is None and all(r >= 1.0 for r in self.keep_ratios)
        if options["distinct"] and self.members > 1 and every_head and self.keep_ratio_selects_heads:
            raise OptionError(
                f"keep_ratio: 1.0 keeps every head, so {self.members} members cannot differ (distinct: true); "
                "use a ratio below 1, or distinct: false"
            )
        self.seed = options["seed"]
        self.diversity = options["diversity"] or self.diversity_choices[0]
        self.distinct = options["distinct"]
        self.allow_empty_blocks = options["allow_empty_blocks"]
        self.last_scores: list[list[torch.Tensor]] | None = None  # per member, per block (for plots)
        # batches of validation outlier inputs, set by the prune step when the data has them
        self.outliers: list[torch.Tensor] | None = None

    def prune(
        self, family: Family, calibration: Sequence[Batch], heldout: Sequence[Batch] | None = None
    ) -> list[HeadMask]:
        """Return `members` head masks for the model behind `family`."""
        raise NotImplementedError

    def member_scores(
        self, family: Family, calibration: Sequence[Batch], heldout: Sequence[Batch] | None, member: int
    ) -> list[torch.Tensor]:
        """Per block, member `member`'s head scores on the model as it is now; the prune step's
        `iterative_steps` re-scores the heads left after each step with it. A pruner that does
        not score heads keeps this default (and `can_rescore` is False)."""
        raise NotImplementedError(f"{type(self).__name__} does not score heads")

    @property
    def can_rescore(self) -> bool:
        """True when this pruner overrides `member_scores` (it can re-score heads)."""
        return type(self).member_scores is not Pruner.member_scores

    def preflight(self, family: Family) -> None:
        """Raise MaskError if this pruner cannot produce masks for the model's head counts
        (run before any training): by default, every member keeps at least one head per block."""
        for m in range(self.members):
            for h in family.heads_per_block():
                self.num_keep(h, m)

    def num_keep(self, heads: int, member: int) -> int:
        """How many heads member `member` keeps in a block of `heads` heads."""
        k = int(self.keep_heads) if self.keep_heads is not None else int(round(self.keep_ratios[member] * heads))
        if k <= 0 and not self.allow_empty_blocks:
            raise MaskError(
                f"keep_ratio {self.keep_ratios[member]} keeps no head of {heads} in a block; "
                "raise keep_ratio/keep_heads or set allow_empty_blocks: true"
            )
        if k > heads:
            raise MaskError(f"keep_heads {k} is more than the {heads} heads of a block")
        return max(k, 0)

    def keep_block(self, scores: torch.Tensor, member: int) -> torch.Tensor:
        """Boolean mask of one block keeping its highest-scored heads (ties broken by head index)."""
        keep = torch.zeros(scores.numel(), dtype=torch.bool)
        keep[torch.argsort(-scores.double(), stable=True)[: self.num_keep(scores.numel(), member)]] = True
        return keep

    def select(self, scores: Sequence[torch.Tensor], member: int) -> HeadMask:
        """Keep the highest-scored heads of every block."""
        return HeadMask(tuple(self.keep_block(s, member) for s in scores))

    def check(self, masks: list[HeadMask], family: Family) -> list[HeadMask]:
        """Raise MaskError unless every mask fits the model; return the masks."""
        name = type(self).__name__
        for i, m in enumerate(masks):
            m.validate(family.heads_per_block(), self.allow_empty_blocks, where=f"{name} member {i}")
        return masks


class Merger:
    """Turns a base model and M head masks (and optionally M fine-tuned members) into one nn.Module.

    A merger also says whether it can handle an architecture (`check`, run before any training),
    which models it produced (`owns`), and how to describe and rebuild them for an export.
    """

    def check(self, family: Family) -> None:
        """Raise UnsupportedModelError if this merger cannot handle the family's architecture."""

    def min_members(self) -> int:
        """How many member masks this merger needs (checked against the prune step before work)."""
        return 1

    def honours_mlp_units(self) -> bool:
        """True when the merged model keeps exactly the MLP units the masks name (the prune step
        owns that choice); a merger that runs full MLPs returns False and `validate` refuses a
        prune step that chooses units before it."""
        return True

    def shared_trunk(self, model: nn.Module) -> int | None:
        """How many leading blocks the merged model runs once for every member (its shared trunk);
        None for a merger without one, which the merge step then does not check against
        `prune.shared_blocks`."""
        return None

    def chooses_mlp_units(self) -> bool:
        """True when this merger picks MLP units itself (for masks that name none); `validate`
        refuses that beside a prune step that already chose them."""
        return False

    def merge(
        self,
        base: nn.Module,
        masks: Sequence[HeadMask],
        members: Sequence[nn.Module] | None = None,
        calibration: Sequence[torch.Tensor] | None = None,
    ) -> nn.Module:
        """Return the merged model. `members[i]`, if given, is member i fine-tuned (head-masked)."""
        raise NotImplementedError

    @classmethod
    def owns(cls, model: nn.Module) -> bool:
        """True if `model` is what this merger produces (so its `describe`/`rebuild` apply)."""
        return False

    @classmethod
    def describe(cls, model: nn.Module) -> dict:
        """JSON-able architecture of a merged model, enough for `rebuild`."""
        raise NotImplementedError(f"{cls.__name__} cannot describe models for an export")

    @classmethod
    def rebuild(cls, config: dict) -> nn.Module:
        """An empty model of the architecture `describe` wrote (weights are loaded after)."""
        raise NotImplementedError(f"{cls.__name__} cannot rebuild models from an export")

    @classmethod
    def verify(cls, model: nn.Module) -> None:
        """Raise ExportError if a rebuilt model's loaded weights contradict its description."""

    @classmethod
    def write_extras(cls, model: nn.Module, folder: Any, masks: Sequence[HeadMask]) -> None:
        """Write anything beyond weights and config into an export folder (default: nothing)."""
