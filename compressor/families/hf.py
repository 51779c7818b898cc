"""What the transformers families share: config-based descriptions, activations, the fused
model's stems and heads, and `save_pretrained` copies that transformers loads on its own.

transformers 5 ignores `head_mask` and has no `prune_heads`, so heads are gated and removed by the
family layer itself (see base.py).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

from compressor.core.errors import UnsupportedModelError
from compressor.core.masks import HeadMask
from compressor.families.base import Family
from compressor.families.classifiers import MeanPoolClassifier
from compressor.families.parts import head_columns

# transformers' `hidden_act` names -> the fused model's activation names
ACT_NAMES = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "quick_gelu": "quick_gelu",
    "relu": "relu",
    "silu": "silu",
}


def tokenizer_pad_id(tokenizer: Any) -> int:
    """The token id a transformers tokenizer pads with (0 when it declares none)."""
    return int(tokenizer.pad_token_id or 0)


def with_depth(config: dict, depth: int | None) -> dict:
    """A config dict with `num_hidden_layers` replaced (when `depth` is given)."""
    return config if depth is None else {**config, "num_hidden_layers": depth}


def transformers_class(name: str) -> type:
    """A transformers model class by name (only classes transformers itself exports)."""
    import transformers

    cls = getattr(transformers, str(name), None)
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        raise UnsupportedModelError(f"'{name}' is not a transformers model class")
    return cls


class TransformersFamily(Family):
    """Base of the transformers families: the encoder's config answers sizes and activations."""

    def config(self) -> Any:
        """The transformers config of the encoder whose blocks this family sees."""
        raise NotImplementedError

    def activation(self) -> str:
        act = self.config().hidden_act
        if act not in ACT_NAMES:
            raise UnsupportedModelError(f"{self.name}: activation '{act}' is not supported")
        return ACT_NAMES[act]

    def standard_block_problems(self) -> list[str]:
        try:
            self.activation()
        except UnsupportedModelError as e:
            return [str(e)]
        return []


class TextEncoderFamily(TransformersFamily):
    """Text encoders seen bare or as `MeanPoolClassifier(encoder)` (the form whose head can run on its own)."""

    def encoder(self) -> nn.Module:
        """The transformers encoder (inside the MeanPoolClassifier, or the model itself)."""
        return self.model.encoder if isinstance(self.model, MeanPoolClassifier) else self.model

    def config(self) -> Any:
        return self.encoder().config

    def final_norm(self) -> nn.Module | None:
        """A LayerNorm the encoder applies to every token after its last block (None: none)."""
        return None

    def classifier(self) -> nn.Module:
        return self.model.head if isinstance(self.model, MeanPoolClassifier) else nn.Identity()

    def standard_block_problems(self) -> list[str]:
        if not isinstance(self.model, MeanPoolClassifier):
            return [
                f"{type(self.model).__name__} is not supported; wrap it as "
                "compressor.families.classifiers.MeanPoolClassifier(encoder, num_classes)"
            ]
        return super().standard_block_problems()

    def stem_and_head(self) -> tuple[nn.Module, nn.Module]:
        stem = TokenStem(self.encoder().embeddings, self.model.pad_token_id)
        return stem, PooledHead(self.model.head, "tokens", norm=self.final_norm())

    def describe(self) -> dict:
        arch = {"config": self.config().to_dict()}
        if isinstance(self.model, MeanPoolClassifier):
            arch["mean_pool"] = {"num_classes": self.model.head.out_features, "pad_token_id": self.model.pad_token_id}
        return arch

    @staticmethod
    def wrap(encoder: nn.Module, arch: dict) -> nn.Module:
        """`encoder` as the described model: bare, or inside a MeanPoolClassifier."""
        if "mean_pool" not in arch:
            return encoder.eval()
        mp = arch["mean_pool"]
        return MeanPoolClassifier(encoder, int(mp["num_classes"]), int(mp["pad_token_id"])).eval()

    def save_pretrained(self, folder: Path, mask: HeadMask) -> str:
        """The encoder for `AutoModel.from_pretrained`, and, for a MeanPoolClassifier, its head as
        `mean_pool_head.safetensors` (logits = mean of the real tokens' states @ weight.T + bias)."""
        encoder = self.encoder()
        target = Path(folder) / "hf_encoder"
        save_full_size(type(self)(encoder), type(encoder)(encoder.config), mask, target)
        if isinstance(self.model, MeanPoolClassifier):
            from safetensors.torch import save_file

            head = self.model.head
            tensors = {"weight": head.weight.detach().contiguous(), "bias": head.bias.detach().contiguous()}
            save_file(tensors, str(target / "mean_pool_head.safetensors"), metadata={"pooling": "mean of real tokens"})
        return "hf_encoder"


class TokenStem(nn.Module):
    """Token ids [B, L] -> embeddings [B, L, D] and the key mask (True = a real token)."""

    def __init__(self, embeddings: nn.Module, pad_token_id: int) -> None:
        super().__init__()
        self.embeddings = copy.deepcopy(embeddings)
        self.pad_token_id = int(pad_token_id)

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.embeddings(input_ids=input_ids), input_ids != self.pad_token_id

    def tokens_per_sample(self, input_ids: torch.Tensor) -> int:
        return int(input_ids.shape[-1])


class ImageStem(nn.Module):
    """Images -> patch + position embeddings (then an optional norm, CLIP's pre_layrnorm)."""

    def __init__(self, embeddings: nn.Module, tokens: int, norm: nn.Module | None = None) -> None:
        super().__init__()
        self.embeddings = copy.deepcopy(embeddings)
        self.norm = copy.deepcopy(norm) if norm is not None else nn.Identity()
        self.tokens = int(tokens)

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, None]:
        return self.norm(self.embeddings(pixel_values)), None

    def tokens_per_sample(self, pixel_values: torch.Tensor) -> int:
        return self.tokens


class PooledHead(nn.Module):
    """tokens [N, T, D] -> pooled [N, D] -> classifier: `pool` is 'first' (the class token),
    'patches' (mean of every token after the first) or 'tokens' (mean of the real tokens).
    `norm` (a final LayerNorm, per token) runs before pooling."""

    def __init__(self, classifier: nn.Module, pool: str, norm: nn.Module | None = None) -> None:
        super().__init__()
        self.norm = copy.deepcopy(norm) if norm is not None else nn.Identity()
        self.classifier = copy.deepcopy(classifier)
        self.pool = pool

    def pooled(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        if self.pool == "first":
            return self.norm(x[:, 0])  # a per-token norm: pooling first is the same, and cheaper
        x = self.norm(x)
        if self.pool == "patches":
            return x[:, 1:].mean(1)
        m = key_mask[..., None].to(x.dtype)
        return (x * m).sum(1) / m.sum(1).clamp_min(1.0)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.classifier(self.pooled(x, key_mask))

    def feature_layer(self) -> nn.Module:
        """The layer whose input is the pooled feature (feature-based OOD scores read it)."""
        return self.classifier


def save_full_size(family: Family, empty_full: nn.Module, mask: HeadMask, folder: Path) -> None:
    """`save_pretrained` of a head-pruned model as its full-size architecture (`empty_full`),
    the removed heads written as zero weights at their original places, so that transformers'
    `from_pretrained` loads it without this project and gives the pruned model's outputs; removed
    MLP units likewise become zero rows/columns.

    transformers 5 cannot describe a different head count per layer (no `pruned_heads`), so this
    copy is not smaller; the physically smaller weights are the export's model.safetensors.
    """
    full = type(family)(empty_full)
    with torch.no_grad():
        small_params = dict(family.model.named_parameters())
        for name, p in empty_full.named_parameters():
            if small_params[name].shape == p.shape:
                p.copy_(small_params[name])
        for b in range(full.num_blocks):
            cols = head_columns(torch.as_tensor(mask.kept_indices(b), dtype=torch.long), full.head_dim(b))
            wf, ws = full.head_weights(b), family.head_weights(b)
            for name in ("q", "k", "v"):
                tf, ts = getattr(wf, name), getattr(ws, name)  # [H, hd, D] views of the weights
                tf.zero_()
                tf.view(-1, tf.shape[-1])[cols] = ts.reshape(-1, ts.shape[-1])
                bf, bs = getattr(wf, name + "_bias"), getattr(ws, name + "_bias")
                if bf is not None:
                    bf.zero_()
                    bf.view(-1)[cols] = bs.reshape(-1)
            wf.o.zero_()
            wf.o.view(wf.o.shape[0], -1)[:, cols] = ws.o.reshape(ws.o.shape[0], -1)
            if mask.units is not None:  # removed MLP units: zero rows of fc1, zero columns of fc2
                units = torch.as_tensor(mask.kept_units(b), dtype=torch.long)
                mf, ms = full.mlp(b), family.mlp(b)
                f1, s1, f2, s2 = mf.fc1.get(), ms.fc1.get(), mf.fc2.get(), ms.fc2.get()
                f1.weight.zero_()
                f1.weight[units] = s1.weight
                if f1.bias is not None:
                    f1.bias.zero_()
                    f1.bias[units] = s1.bias
                f2.weight.zero_()
                f2.weight[:, units] = s2.weight
    empty_full.save_pretrained(str(folder))
