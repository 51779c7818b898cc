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
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from compressor.data import sharded_batches
from compressor.device import fp16_autocast, model_device
from compressor.distributed import all_reduce_sum, is_distributed, is_main, world_size
from compressor.errors import InputError, WorkError
from compressor.inference import predict
from compressor.outliers import OutlierMaker
from compressor.outputs import logits_reader


@dataclass
class TrainConfig:
    steps: int = 200
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup_steps: int = 10
    label_smoothing: float = 0.0
    eval_every: int = 25
    patience: int | None = None  # evaluations without improvement before stopping; None: never
    seed: int = 0
    bootstrap: bool = False  # ensembles: each member weighs each sample by its own Poisson(1) draw
    ensemble_member: bool = False  # one member trained alone: per-member levers (bootstrap) apply to it
    disagreement: float = 0.0  # ensembles: reward for member disagreement on synthetic outliers
    distill_alpha: float = 0.0  # weight of logit distillation from a teacher (0: plain cross-entropy)
    distill_temperature: float = 2.0


def mutual_information(logits: torch.Tensor) -> torch.Tensor:
    """Per sample, the members' disagreement H(mean_m p_m) - mean_m H(p_m) from logits [M, B, C]."""
    logp = logits.float().log_softmax(-1)
    p = logp.exp()
    mean = p.mean(0)
    h_mean = -(mean * mean.clamp_min(1e-12).log()).sum(-1)
    return h_mean - (-(p * logp).sum(-1)).mean(0)


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
    from compressor.metrics import accuracy, ece, nll

    _, p, y = predict(model, ds, batch_size)
    return {"accuracy": accuracy(p, y), "nll": nll(p, y), "ece": ece(p, y)}


def heldout_nll(model: nn.Module, ds: Dataset, batch_size: int = 256) -> float:
    """NLL of the averaged member probabilities over `ds` (every rank gets the same number)."""
    _, probs, y = predict(model, ds, batch_size)
    p = probs[torch.arange(len(y)), y]
    return float(-torch.log(p.double().clamp_min(1e-12)).mean())


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
    worse leaves it as it was. Ensemble levers (no effect on a single model): `cfg.bootstrap`
    weighs each sample by a per-member Poisson(1) draw (bagging inside one fused model, or, for
    a member trained alone with `cfg.ensemble_member`, by that member's own draws);
    `cfg.disagreement` subtracts that multiple of the members' mutual information on synthetic
    outliers made from each batch by `make_outliers` (rewarding disagreement off the data).
    With a `teacher` and `cfg.distill_alpha` > 0, each member's loss is (1 - alpha) cross-entropy
    + alpha T^2 KL(teacher || member) at temperature T (Hinton et al. 2015 logit distillation).
    """
    torch.manual_seed(cfg.seed)
    net = model
    if is_distributed():
        net = nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / max(1, cfg.warmup_steps)
        progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    read = logits_reader(model)
    history: dict = {"loss": [], "val_nll": [], "best_step": 0, "stopped_early": False}
    started = time.time()
    best_nll, best_state, bad_evals = math.inf, None, 0
    if val_ds is not None:
        history["before"] = heldout_metrics(model, val_ds)
        best_nll = history["before"]["nll"]
        history["val_nll"].append((0, best_nll))
        best_state = copy.deepcopy(model.state_dict())
    # without a held-out set, the weights as given are what a diverged run falls back to
    fallback = None if val_ds is not None else copy.deepcopy(model.state_dict())
    gen = torch.Generator().manual_seed(cfg.seed + 7919)
    read_teacher = logits_reader(teacher) if teacher is not None and cfg.distill_alpha > 0 else None
    if read_teacher is not None:
        teacher.eval()
    device = model_device(model)
    scaler = torch.amp.GradScaler("cuda") if fp16_autocast() else None
    if cfg.disagreement and make_outliers is None:
        raise InputError("finetune.disagreement: the data provides no synthetic outliers")
    model.train()
    step, epoch = 0, 0
    bar = tqdm(total=cfg.steps, desc=desc, leave=False, dynamic_ncols=True, disable=not is_main() or None)
    while step < cfg.steps:
        for batch, real in sharded_batches(train_ds, cfg.batch_size, shuffle=True, seed=cfg.seed, epoch=epoch):
            x, y = (t.to(device) for t in batch)
            n = len(y)
            inputs = torch.cat([x, make_outliers(x, gen)]) if cfg.disagreement else x
            logits = read(net(inputs))
            m = logits.shape[0]
            per = F.cross_entropy(
                logits[:, :n].reshape(m * n, -1), y.repeat(m), label_smoothing=cfg.label_smoothing, reduction="none"
            ).view(m, n)
            if read_teacher is not None:
                t = cfg.distill_temperature
                with torch.no_grad():
                    target = (read_teacher(teacher(x))[0].float() / t).log_softmax(-1)  # [B, C]
                student = (logits[:, :n].float() / t).log_softmax(-1)  # [M, B, C]
                kl = (target.exp() * (target - student)).sum(-1) * (t * t)
                per = (1 - cfg.distill_alpha) * per + cfg.distill_alpha * kl.to(per.dtype)
            if cfg.bootstrap and (m > 1 or cfg.ensemble_member):
                per = per * torch.poisson(torch.ones(m, n), generator=gen).to(per)
            is_real = (torch.arange(n, device=device) < real).to(per.dtype)
            local_sum = (per.mean(0) * is_real).sum()
            # [loss sum, real samples] of the whole global batch, so every rank divides by the same count
            count = torch.tensor(real, dtype=torch.float64, device=device)
            totals = all_reduce_sum(torch.stack([local_sum.detach().double(), count]))
            if not bool(torch.isfinite(totals).all()):
                _stop_non_finite(model, best_state if fallback is None else fallback, step, history)
            loss = local_sum / totals[1].to(local_sum.dtype)
            if cfg.disagreement and m > 1:
                reward = (mutual_information(logits[:, n:]) * is_real).sum() / totals[1].to(local_sum.dtype)
                loss = loss - cfg.disagreement * reward
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
            if val_ds is not None and (step % cfg.eval_every == 0 or step == cfg.steps):
                v = heldout_nll(model, val_ds)
                history["val_nll"].append((step, v))
                if v < best_nll - 1e-6:
                    best_nll, bad_evals, history["best_step"] = v, 0, step
                    best_state = copy.deepcopy(model.state_dict())
                else:
                    bad_evals += 1
                    if cfg.patience is not None and bad_evals >= cfg.patience:
                        history["stopped_early"] = True
                        step = cfg.steps
            if step >= cfg.steps:
                break
        epoch += 1
    bar.close()
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    if val_ds is not None:
        history["after"] = heldout_metrics(model, val_ds)
    history["seconds"] = time.time() - started
    return history
