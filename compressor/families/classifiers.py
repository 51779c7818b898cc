"""Classifiers this project builds around transformers encoders.

- `MeanPoolClassifier`: any transformers text encoder (BERT-style, CLIP text) -> mean of the
  non-padding token states -> Linear. Takes token ids only, so it batches like any tensor model.
- `ZeroShotCLIP`: CLIP's `logits_per_image` for fixed class prompts, whose text embeddings are
  computed once; per image only the vision tower runs (the paper's zero-shot CLIP setting).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from compressor.core.errors import WeightsError, first_line
from compressor.core.modes import evaluating
from compressor.core.weights import non_finite


class MeanPoolClassifier(nn.Module):
    """encoder(input_ids) -> mean of the non-padding token states -> Linear: class logits.

    Takes token ids [B, L] only (padding = `pad_token_id`).
    """

    def __init__(self, encoder: nn.Module, num_classes: int, pad_token_id: int = 0) -> None:
        super().__init__()
        self.encoder = encoder
        self.pad_token_id = pad_token_id
        self.head = nn.Linear(encoder.config.hidden_size, num_classes)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        mask = (input_ids != self.pad_token_id).long()
        states = self.encoder(input_ids=input_ids, attention_mask=mask).last_hidden_state
        m = mask.unsqueeze(-1).to(states.dtype)
        return self.head((states * m).sum(1) / m.sum(1).clamp_min(1.0))


@contextmanager
def _transformers_quiet() -> Iterator[None]:
    """No progress bars or load reports from transformers: what goes wrong is raised here, in one line."""
    from transformers.utils import logging as hf_logging

    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()
        hf_logging.set_verbosity(verbosity)


def load_text_classifier(path: str, num_classes: int) -> MeanPoolClassifier:
    """A transformers encoder (local folder or hub name) with a new mean-pool class head; the
    padding id comes from the model's own tokenizer.

    Only safetensors weights are read (a pickled `pytorch_model.bin` is never opened), no code the
    folder names is run, and weights that do not fit the architecture (which transformers would
    re-initialise with a warning), are missing or hold NaN or infinity are refused, as for any
    weights file. Missing pooler weights are allowed: the mean-pool head never uses the pooler.
    """
    from transformers import AutoModel, AutoTokenizer

    try:
        with _transformers_quiet():
            encoder, info = AutoModel.from_pretrained(
                path,
                use_safetensors=True,
                trust_remote_code=False,
                output_loading_info=True,
                ignore_mismatched_sizes=True,  # reported in `info`, refused below with the tensor names
            )
            pad = AutoTokenizer.from_pretrained(path, trust_remote_code=False).pad_token_id or 0
    except (OSError, ValueError, RuntimeError) as e:
        raise WeightsError(
            f"model.name: cannot load transformers model '{path}' ({type(e).__name__}: {first_line(e)}); "
            "expected a folder or hub name with model.safetensors (pickled .bin weights are never loaded)"
        ) from e
    mismatched = [str(k[0] if isinstance(k, tuple) else k) for k in info.get("mismatched_keys") or []]
    missing = [k for k in info.get("missing_keys") or [] if not k.startswith("pooler.")]
    if mismatched or missing:
        kind, keys = ("shapes do not fit the architecture", mismatched) if mismatched else ("missing", missing)
        raise WeightsError(f"model.name: '{path}': weights {kind} ({', '.join(sorted(keys)[:3])})")
    bad = non_finite(encoder.state_dict())
    if bad:
        raise WeightsError(f"model.name: '{path}': weights hold NaN or infinity ({', '.join(bad[:3])})")
    return MeanPoolClassifier(encoder, num_classes, pad)


class ZeroShotCLIP(nn.Module):
    """encoder (a CLIPVisionModel) -> visual projection -> cosine similarity to fixed class embeddings.

    logits = exp(logit_scale) * cos(image embedding, class prompt embedding), exactly CLIP's
    `logits_per_image` for those prompts.
    """

    def __init__(
        self, encoder: nn.Module, projection: nn.Linear, class_embeds: torch.Tensor, logit_scale: float
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.projection = projection
        self.register_buffer("class_embeds", class_embeds / class_embeds.norm(dim=-1, keepdim=True))
        self.register_buffer("logit_scale", torch.tensor(float(logit_scale)))

    @classmethod
    @torch.no_grad()
    def from_clip(
        cls, clip: nn.Module, prompt_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> ZeroShotCLIP:
        """From a transformers CLIPModel and one tokenised prompt per class ("a photo of a {name}")."""
        with evaluating(clip):
            text = clip.get_text_features(input_ids=prompt_ids, attention_mask=attention_mask).pooler_output
        return cls(clip.vision_model, clip.visual_projection, text.detach().clone(), float(clip.logit_scale.exp()))

    @classmethod
    def empty(cls, vision_config: dict, projection_dim: int, num_classes: int) -> ZeroShotCLIP:
        """The architecture of an export, to be filled by load_state_dict."""
        from transformers import CLIPVisionConfig, CLIPVisionModel

        config = CLIPVisionConfig.from_dict(vision_config)
        projection = nn.Linear(config.hidden_size, projection_dim, bias=False)
        return cls(CLIPVisionModel(config), projection, torch.ones(num_classes, projection_dim), 1.0)

    def export_config(self) -> dict:
        """What `empty` needs to rebuild this model."""
        return {
            "vision_config": self.encoder.config.to_dict(),
            "projection_dim": self.projection.out_features,
            "num_classes": self.class_embeds.shape[0],
        }

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        image = self.projection(self.encoder(pixel_values=pixel_values).pooler_output)
        image = image / image.norm(dim=-1, keepdim=True)
        return self.logit_scale * image @ self.class_embeds.t()
