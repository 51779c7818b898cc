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
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from compressor.data import sharded_batches
from compressor.distributed import all_reduce_sum, is_distributed, is_main, world_size
from compressor.outputs import logits_reader
from compressor.predict import predict


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


def ensemble_loss(
    logits: torch.Tensor, y: torch.Tensor, label_smoothing: float = 0.0, reduction: str = "mean"
) -> torch.Tensor:
    """Mean over members of each member's cross-entropy, from member logits [M, B, C] (per sample,
    [B], with reduction='none')."""
    m, b, c = logits.shape
    per = F.cross_entropy(logits.reshape(m * b, c), y.repeat(m), label_smoothing=label_smoothing, reduction="none")
    per = per.view(m, b).mean(0)
    return per if reduction == "none" else per.mean()


def heldout_nll(model: nn.Module, ds: Dataset, batch_size: int = 256) -> float:
    """NLL of the averaged member probabilities over `ds` (every rank gets the same number)."""
    probs, y = predict(model, ds, batch_size)
    p = probs.mean(0)[torch.arange(len(y)), y]
    return float(-torch.log(p.double().clamp_min(1e-12)).mean())


def train(model: nn.Module, train_ds: Dataset, val_ds: Dataset | None, cfg: TrainConfig, desc: str = "train") -> dict:
    """Train `model` in place for `cfg.steps` steps; return the history (losses, val NLL, best step)."""
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
    best_nll, best_state, bad_evals = math.inf, None, 0
    model.train()
    step, epoch = 0, 0
    bar = tqdm(total=cfg.steps, desc=desc, leave=False, dynamic_ncols=True, disable=not is_main() or None)
    while step < cfg.steps:
        for batch, real in sharded_batches(train_ds, cfg.batch_size, shuffle=True, seed=cfg.seed, epoch=epoch):
            x, y = batch
            per_sample = ensemble_loss(read(net(x)), y, cfg.label_smoothing, reduction="none")
            local_sum = (per_sample * (torch.arange(len(y)) < real).to(per_sample.dtype)).sum()
            # [loss sum, real samples] of the whole global batch, so every rank divides by the same count
            totals = all_reduce_sum(torch.stack([local_sum.detach().double(), torch.tensor(real, dtype=torch.float64)]))
            loss = local_sum / totals[1].to(local_sum.dtype)
            opt.zero_grad(set_to_none=True)
            (loss * world_size()).backward()  # DDP averages gradients over ranks: undo its 1/N
            opt.step()
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
    return history
