"""Post-hoc calibration and the deployed OOD threshold.

- Temperature scaling (Guo et al. 2017): member logits are divided by a temperature fitted on the
  held-out split by minimising the NLL of the ensemble's averaged probabilities; one temperature
  for every member (default) or one per member. Accuracy cannot change: argmax is unaffected for
  one temperature, and per-member temperatures only reweight members.
- An OOD threshold: the score (max-softmax, entropy or, for ensembles, mutual information) that
  keeps `tpr` (default 95%) of held-out in-distribution samples; `predict` flags samples above it.

`Calibrated` wraps any model with both; the export stores them and `compressor.load` restores them.
"""

from __future__ import annotations

import torch
from torch import nn

from compressor.outputs import EnsembleOutput, logits_reader

OOD_SCORES = ("msp", "entropy", "mi")


def fit_temperature(member_logits: torch.Tensor, labels: torch.Tensor, per_member: bool = False) -> torch.Tensor:
    """Temperature(s) minimising the NLL of mean_m softmax(logits_m / T_m) on (logits [M, N, C], labels)."""
    logits = member_logits.detach().double()
    m = logits.shape[0]
    log_t = torch.zeros(m if per_member else 1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=0.5, max_iter=200, line_search_fn="strong_wolfe")

    def nll() -> torch.Tensor:
        t = log_t.exp().view(-1, 1, 1)
        probs = (logits / t).softmax(-1).mean(0)
        return -probs[torch.arange(len(labels)), labels].clamp_min(1e-12).log().mean()

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = nll()
        loss.backward()
        return loss

    opt.step(closure)
    return log_t.detach().exp().float().expand(m).clone()


def ood_scores(member_probs: torch.Tensor, score: str) -> torch.Tensor:
    """Per sample, higher = more likely OOD: -max prob, entropy, or mutual information (members)."""
    p = member_probs.mean(0)
    entropy = lambda q: -(q * q.clamp_min(1e-12).log()).sum(-1)  # noqa: E731
    if score == "msp":
        return -p.amax(-1)
    if score == "entropy":
        return entropy(p)
    if score == "mi":
        return entropy(p) - torch.stack([entropy(q) for q in member_probs]).mean(0)
    raise ValueError(f"ood score: expected one of {', '.join(OOD_SCORES)}, got '{score}'")


def ood_threshold(scores_in: torch.Tensor, tpr: float = 0.95) -> float:
    """The smallest score that accepts (score <= it) at least `tpr` of in-distribution samples:
    the same threshold FPR95 is measured at."""
    s = torch.sort(scores_in.double()).values
    n = len(s)
    k = max(1, int(tpr * n) - 1)
    while k < n and k / n < tpr:
        k += 1
    return float(s[k - 1])


class Calibrated(nn.Module):
    """`model` with its member logits divided by `temperature` ([M] or a scalar) and an OOD
    threshold attached (`ood`: {"score", "tpr", "threshold"}). Output: EnsembleOutput."""

    def __init__(self, model: nn.Module, temperature: torch.Tensor | float = 1.0, ood: dict | None = None) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("temperature", torch.as_tensor(temperature, dtype=torch.float32).flatten().clone())
        self.ood = dict(ood or {})
        self._read = logits_reader(model)

    @property
    def members(self) -> int:
        """The wrapped model's member count (1 for a single model)."""
        return int(getattr(self.model, "members", 1))

    def forward(self, x: torch.Tensor) -> EnsembleOutput:
        logits = self._read(self.model(x))
        return EnsembleOutput.from_logits(logits / self.temperature.to(logits.dtype).view(-1, 1, 1))

    def config(self) -> dict:
        """What an export records: the temperatures and the OOD threshold."""
        return {"temperature": self.temperature.tolist(), "ood": self.ood}
