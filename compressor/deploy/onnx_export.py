"""Optional ONNX export of a merged model, checked against torch with onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from compressor.core.errors import WorkError


class _LogitsOnly(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor):
        out = self.model(x)
        return tuple(out) if isinstance(out, tuple) else out


def export_onnx(model: nn.Module, example: torch.Tensor, path: Path, atol: float = 1e-4) -> None:
    """Write `path` and verify onnxruntime's outputs match torch's on `example`."""
    import onnxruntime as ort

    wrapped = _LogitsOnly(model).eval()
    with torch.no_grad():
        ref = wrapped(example)
    ref = ref if isinstance(ref, tuple) else (ref,)
    torch.onnx.export(
        wrapped,
        (example,),
        str(path),
        input_names=["inputs"],
        dynamo=False,
        dynamic_axes={"inputs": {0: "batch"}},
        opset_version=17,
    )
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"inputs": example.numpy()})
    for r, g in zip(ref, got):
        if not np.allclose(r.numpy(), g, atol=atol, rtol=1e-4):
            raise WorkError(f"{path}: onnxruntime output differs from torch by {np.abs(r.numpy() - g).max():.2e}")
