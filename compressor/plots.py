"""PNG plots for the evaluate step: reliability diagrams and head-importance heatmaps."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from compressor.io import atomic_path  # noqa: E402
from compressor.masks import HeadMask  # noqa: E402
from compressor.metrics import ece, reliability_bins  # noqa: E402


def _save(fig, path: Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def reliability_diagram(probs, labels, title: str, path: Path, bins: int = 15) -> None:
    """Accuracy against confidence per bin, with the ECE in the title."""
    conf, acc, counts = reliability_bins(probs, labels, bins)
    centers = (np.arange(bins) + 0.5) / bins
    fig, ax = plt.subplots(figsize=(4, 4))
    has = counts > 0
    ax.bar(centers[has], acc[has], width=1.0 / bins, edgecolor="black", alpha=0.7, label="accuracy")
    ax.plot(conf[has], conf[has], "r.", label="mean confidence")
    ax.plot([0, 1], [0, 1], "k--", linewidth=1)
    ax.set(
        xlim=(0, 1),
        ylim=(0, 1),
        xlabel="confidence",
        ylabel="accuracy",
        title=f"{title}\nECE {ece(probs, labels, bins):.3f}",
    )
    ax.legend(loc="upper left", fontsize=8)
    _save(fig, path)


def head_importance_heatmaps(scores: Sequence[Sequence[torch.Tensor]], masks: Sequence[HeadMask], path: Path) -> None:
    """One panel per member: blocks x heads importance (normalised per block), kept heads marked."""
    m = len(masks)
    fig, axes = plt.subplots(1, m, figsize=(3.2 * m, 3), squeeze=False)
    for i, (ax, mask) in enumerate(zip(axes[0], masks)):
        grid = []
        for s in scores[min(i, len(scores) - 1)]:
            s = torch.nan_to_num(s.float(), neginf=0.0, posinf=0.0)
            span = (s.max() - s.min()).clamp_min(1e-12)
            grid.append(((s - s.min()) / span).numpy())
        ax.imshow(np.stack(grid), cmap="viridis", aspect="auto", vmin=0, vmax=1)
        for b, blk in enumerate(mask.blocks):
            for h in torch.nonzero(blk).flatten().tolist():
                ax.plot(h, b, "s", markerfacecolor="none", markeredgecolor="white", markersize=6)
        ax.set(title=f"member {i} ({sum(mask.num_kept())} heads)", xlabel="head", ylabel="block")
    fig.suptitle("head importance per block (squares: kept heads)", fontsize=9)
    _save(fig, path)
