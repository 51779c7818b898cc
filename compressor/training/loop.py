"""Short supervised training: the base model, member fine-tunes and the calibration fine-tune.

AdamW, linear warm-up then cosine decay over a step budget, optional label smoothing, early
stopping on held-out NLL (the best weights are restored). For a fused ensemble every member's
logits get their own cross-entropy, averaged, so members stay independent models.

Under torch.distributed the model is wrapped in DistributedDataParallel and every rank trains on
its DistributedSampler shard of each global batch, with the loss divided by the global batch's
sample count (sampler padding weighted out), so the averaged gradient is the global batch's: N
processes take the same steps as one process with the same batch size.
"""

from __future__ import annotations

import copy
import math
import time

import torch
from torch import nn
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from compressor.core.device import fp16_autocast
from compressor.core.distributed import is_distributed, is_main, world_size
from compressor.core.errors import InputError, WorkError
from compressor.data.bundle import sharded_batches
from compressor.data.outliers import OutlierMaker
from compressor.training.config import TrainConfig
from compressor.training.objective import MemberObjective
from compressor.uq.inference import predict


def _stop_non_finite(model: nn.Module, best_state: dict | None, step: int, history: dict) -> None:
    """Stop training at a non-finite loss: restore the last weights known good, then raise."""
    kept = "the last evaluated weights were restored" if best_state is not None else "no finite weights were kept"
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    raise WorkError(
        f"training stopped at step {step + 1}: the loss is not finite (learning rate too high?); {kept} "
        f"(from step {history['best_step']})"
    )


def heldout_metrics(model: nn.Module, ds: Dataset, batch_size: int = 256) -> dict[str, float]:
    """Accuracy, NLL and ECE of the averaged member probabilities over `ds` (the same on every rank)."""
    from compressor.uq.metrics import accuracy, ece, nll

    _, p, y = predict(model, ds, batch_size)
    return {"accuracy": accuracy(p, y), "nll": nll(p, y), "ece": ece(p, y)}


def heldout_nll(model: nn.Module, ds: Dataset, batch_size: int = 256) -> float:
    """NLL of the averaged member probabilities over `ds` (every rank gets the same number)."""
    _, probs, y = predict(model, ds, batch_size)
    p = probs[torch.arange(len(y)), y]
    return float(-torch.log(p.double().clamp_min(1e-12)).mean())


def _optimizer(model: nn.Module, cfg: TrainConfig) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable parameters; linear warm-up, then cosine decay to 0 at `cfg.steps`."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / max(1, cfg.warmup_steps)
        progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_at)


class _EarlyStopping:
    """Held-out NLL before the first step and every `eval_every` steps; the best weights so far
    (restored at the end), and whether `patience` evaluations passed without improvement."""

    def __init__(self, model: nn.Module, val_ds: Dataset | None, patience: int | None, history: dict) -> None:
        self.model, self.val_ds, self.patience, self.history = model, val_ds, patience, history
        self.best_nll, self.best_state, self.bad_evals = math.inf, None, 0
        if val_ds is not None:
            history["before"] = heldout_metrics(model, val_ds)
            self.best_nll = history["before"]["nll"]
            history["val_nll"].append((0, self.best_nll))
            self.best_state = copy.deepcopy(model.state_dict())
        # without a held-out set, the weights as given are what a diverged run falls back to
        self.fallback = None if val_ds is not None else copy.deepcopy(model.state_dict())

    def known_good(self) -> dict | None:
        """The weights a diverged run falls back to."""
        return self.best_state if self.fallback is None else self.fallback

    def should_stop(self, step: int) -> bool:
        """Measure the held-out NLL after `step` steps, keep the weights when they are the best."""
        v = heldout_nll(self.model, self.val_ds)
        self.history["val_nll"].append((step, v))
        if v < self.best_nll - 1e-6:
            self.best_nll, self.bad_evals, self.history["best_step"] = v, 0, step
            self.best_state = copy.deepcopy(self.model.state_dict())
            return False
        self.bad_evals += 1
        return self.patience is not None and self.bad_evals >= self.patience


def _endless_batches(train_ds: Dataset, cfg: TrainConfig):
    """(this rank's batch, its real samples), epoch after epoch, each epoch reshuffled."""
    epoch = 0
    while True:
        yield from sharded_batches(train_ds, cfg.batch_size, shuffle=True, seed=cfg.seed, epoch=epoch)
        epoch += 1


def train(
    model: nn.Module,
    train_ds: Dataset,
    val_ds: Dataset | None,
    cfg: TrainConfig,
    desc: str = "train",
    make_outliers: OutlierMaker | None = None,
    teacher: nn.Module | None = None,
) -> dict:
    """Train `model` in place for `cfg.steps` steps; return the history (losses, val NLL, best step).

    The held-out NLL is measured before the first step too, so a fine-tune that makes the model
    worse leaves it as it was (`cfg.keep` "best"; "last" keeps the weights as trained: members
    that would stay at step 0 are near-copies of the base, which an ensemble gains nothing from).
    Ensemble levers (no effect on a single model): `cfg.bootstrap`
    weighs each sample by a per-member Poisson(1) draw (bagging inside one fused model, or, for
    a member trained alone with `cfg.ensemble_member`, by that member's own draws);
    `cfg.disagreement` subtracts that multiple of the members' mutual information on synthetic
    outliers made from each batch by `make_outliers` (rewarding disagreement off the data).
    With a `teacher` and `cfg.distill_alpha` > 0, each member's loss is (1 - alpha) cross-entropy
    + alpha T^2 KL(teacher || member) at temperature T (Hinton et al. 2015 logit distillation).
    """
    torch.manual_seed(cfg.seed)
    net = nn.parallel.DistributedDataParallel(model, broadcast_buffers=False) if is_distributed() else model
    opt, sched = _optimizer(model, cfg)
    history: dict = {"loss": [], "val_nll": [], "best_step": 0, "stopped_early": False}
    started = time.time()
    stopping = _EarlyStopping(model, val_ds, cfg.patience, history)
    if cfg.disagreement and make_outliers is None:
        raise InputError("finetune.disagreement: the data provides no synthetic outliers")
    objective = MemberObjective(model, cfg, make_outliers, teacher)
    scaler = torch.amp.GradScaler("cuda") if fp16_autocast() else None
    model.train()
    bar = tqdm(total=cfg.steps, desc=desc, leave=False, dynamic_ncols=True, disable=not is_main() or None)
    step = 0
    for batch, real in _endless_batches(train_ds, cfg):
        if step >= cfg.steps:
            break
        loss, totals = objective(net, batch, real)
        if not bool(torch.isfinite(totals).all()):
            _stop_non_finite(model, stopping.known_good(), step, history)
        opt.zero_grad(set_to_none=True)
        loss = loss * world_size()  # DDP averages gradients over ranks: undo its 1/N
        if scaler is None:
            loss.backward()
            opt.step()
        else:  # fp16 autocast: scale the loss so small gradients survive
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        sched.step()
        step += 1
        history["loss"].append(float(totals[0] / totals[1]))
        bar.update(1)
        bar.set_postfix(loss=f"{history['loss'][-1]:.3f}")
        if val_ds is not None and (step % cfg.eval_every == 0 or step == cfg.steps) and stopping.should_stop(step):
            history["stopped_early"] = True
            break
    bar.close()
    if stopping.best_state is not None and cfg.keep == "best":
        model.load_state_dict(stopping.best_state)
    history["kept"] = cfg.keep if val_ds is not None else "last"
    model.eval()
    if val_ds is not None:
        history["after"] = heldout_metrics(model, val_ds)
    history["seconds"] = time.time() - started
    return history
