"""PNG plots for the evaluate step: reliability diagrams with per-bin counts (one per model and all
models overlaid), head-importance heatmaps, ROC curves with score histograms per OOD set, and
risk-coverage curves."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from compressor.core.io import atomic_path  # noqa: E402
from compressor.core.masks import HeadMask  # noqa: E402
from compressor.uq.metrics import auroc, ece, max_prob_score, reliability_bins, risk_coverage  # noqa: E402

BINS = 15


def _save(fig, path: Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def reliability_diagram(probs, labels, title: str, path: Path, bins: int = BINS) -> None:
    """Accuracy against confidence per bin (bars), mean confidence per bin (dots), and below it
    how many samples each bin holds, so a 2-sample bin does not look like a 200-sample one."""
    conf, acc, counts = reliability_bins(probs, labels, bins)
    centers = (np.arange(bins) + 0.5) / bins
    fig, (ax, hist) = plt.subplots(
        2, 1, figsize=(4.2, 5.2), sharex=True, gridspec_kw={"height_ratios": [3, 1]}, layout="constrained"
    )
    has = counts > 0
    ax.bar(centers[has], acc[has], width=1.0 / bins, edgecolor="black", alpha=0.7, label="accuracy")
    ax.plot(conf[has], conf[has], "r.", label="mean confidence")
    ax.plot([0, 1], [0, 1], "k--", linewidth=1)
    ax.set(xlim=(0, 1), ylim=(0, 1), ylabel="accuracy", title=f"{title}: ECE {ece(probs, labels, bins):.3f}")
    ax.legend(loc="upper left", fontsize=8)
    hist.bar(centers, counts, width=1.0 / bins, color="grey", edgecolor="black")
    hist.set(xlabel="confidence (max probability)", ylabel="samples")
    _save(fig, path)


def reliability_overlay(models: dict[str, tuple], path: Path, bins: int = BINS) -> None:
    """Every model's reliability curve in one figure, with each model's bin counts below."""
    fig, (ax, hist) = plt.subplots(
        2, 1, figsize=(5.2, 5.8), sharex=True, gridspec_kw={"height_ratios": [3, 1]}, layout="constrained"
    )
    centers = (np.arange(bins) + 0.5) / bins
    for name, (probs, labels) in models.items():
        conf, acc, counts = reliability_bins(probs, labels, bins)
        has = counts > 0
        ax.plot(conf[has], acc[has], "o-", markersize=3, label=f"{name} (ECE {ece(probs, labels, bins):.3f})")
        hist.step(centers, counts, where="mid", label=name)
    ax.plot([0, 1], [0, 1], "k--", linewidth=1)
    ax.set(xlim=(0, 1), ylim=(0, 1), ylabel="accuracy", title="reliability, all models")
    ax.legend(loc="upper left", fontsize=7)
    hist.set(xlabel="confidence (max probability)", ylabel="samples")
    _save(fig, path)


def head_importance_heatmaps(scores: Sequence[Sequence[torch.Tensor]], masks: Sequence[HeadMask], path: Path) -> None:
    """One panel per member: blocks x heads importance (normalised per block), kept heads marked."""
    m = len(masks)
    fig, axes = plt.subplots(1, m, figsize=(3.2 * m, 3.4), squeeze=False, layout="constrained")
    for i, (ax, mask) in enumerate(zip(axes[0], masks)):
        grid = []
        for s in scores[min(i, len(scores) - 1)]:
            s = torch.nan_to_num(s.float(), neginf=0.0, posinf=0.0)
            span = (s.max() - s.min()).clamp_min(1e-12)
            grid.append(((s - s.min()) / span).numpy())
        image = ax.imshow(np.stack(grid), cmap="viridis", aspect="auto", vmin=0, vmax=1)
        for b, blk in enumerate(mask.blocks):
            for h in torch.nonzero(blk).flatten().tolist():
                ax.plot(h, b, "s", markerfacecolor="none", markeredgecolor="white", markersize=6)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set(title=f"member {i}: {sum(mask.num_kept())} heads kept", xlabel="head", ylabel="block")
    fig.colorbar(image, ax=list(axes[0]), shrink=0.8, label="importance (per block, 0..1)")
    fig.suptitle("head importance per block; squares: the heads each member keeps", fontsize=9)
    _save(fig, path)


def ood_plot(set_name: str, models: dict[str, tuple], path: Path) -> None:
    """For one OOD set: every model's ROC curve (OOD positive, score = -max softmax) and, for the
    first model, the histograms of its score on test and OOD samples."""
    fig, (roc, hist) = plt.subplots(1, 2, figsize=(9, 3.8), layout="constrained")
    for name, (probs_in, probs_out) in models.items():
        s_in, s_out = max_prob_score(probs_in), max_prob_score(probs_out)
        thresholds = np.unique(np.concatenate([s_in, s_out]))[::-1]
        tpr = [(s_out >= t).mean() for t in thresholds]
        fpr = [(s_in >= t).mean() for t in thresholds]
        roc.plot([0, *fpr], [0, *tpr], label=f"{name} (AUROC {auroc(s_in, s_out):.3f})")
    roc.plot([0, 1], [0, 1], "k--", linewidth=1)
    roc.set(xlabel="false positive rate (test samples flagged)", ylabel="true positive rate (OOD flagged)")
    roc.set_title(f"OOD set '{set_name}': ROC", fontsize=9)
    roc.legend(fontsize=7, loc="lower right")
    first, (p_in, p_out) = next(iter(models.items()))
    confidences = (-max_prob_score(p_in), -max_prob_score(p_out))
    hist.hist(confidences, bins=20, range=(0, 1), label=["test (in-distribution)", set_name], alpha=0.7)
    hist.set(xlabel="max softmax probability", ylabel="samples")
    hist.set_title(f"{first}: confidence on test vs '{set_name}'", fontsize=9)
    hist.legend(fontsize=7)
    _save(fig, path)


def risk_coverage_plot(models: dict[str, tuple], path: Path) -> None:
    """Selective risk (error rate of the accepted samples) against coverage, every model."""
    fig, ax = plt.subplots(figsize=(5, 3.8), layout="constrained")
    for name, (probs, labels) in models.items():
        coverage, risk = risk_coverage(probs, labels)
        ax.plot(coverage, risk, label=f"{name} (AURC {risk.mean():.3f})")
    ax.set(xlabel="coverage (share of test samples accepted, most confident first)", ylabel="risk (error rate)")
    ax.set_title("risk-coverage", fontsize=9)
    ax.legend(fontsize=7)
    _save(fig, path)


def finetune_curves(histories: dict[str, dict], path: Path) -> None:
    """Every fine-tune's training loss per step and held-out NLL at each evaluation (step 0 included)."""
    fig, (loss_ax, val_ax) = plt.subplots(1, 2, figsize=(9, 3.6), layout="constrained")
    for label, h in histories.items():
        loss_ax.plot(np.arange(1, len(h["loss"]) + 1), h["loss"], label=label)
        steps, values = zip(*h["val_nll"]) if h.get("val_nll") else ((), ())
        val_ax.plot(steps, values, "o-", markersize=3, label=label)
    loss_ax.set(xlabel="step", ylabel="training loss", title="training loss")
    val_ax.set(xlabel="step", ylabel="held-out NLL", title="held-out NLL (step 0: before fine-tuning)")
    for ax in (loss_ax, val_ax):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=7)
    _save(fig, path)
