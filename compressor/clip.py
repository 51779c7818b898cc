"""Zero-shot CLIP as an image classifier: the class prompts' text embeddings are computed once.

logits = exp(logit_scale) * cos(image embedding, class prompt embedding), exactly CLIP's
`logits_per_image` for those prompts. Only the vision tower runs per image, so head scoring,
pruning and the Hydra merger act on the vision tower (the paper's zero-shot CLIP setting: the
gradient-free pruner needs no training at all).
"""

from __future__ import annotations

import torch
from torch import nn


class ZeroShotCLIP(nn.Module):
    """encoder (a CLIPVisionModel) -> visual projection -> cosine similarity to fixed class embeddings."""

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
        was_training = clip.training
        clip.eval()
        text = clip.get_text_features(input_ids=prompt_ids, attention_mask=attention_mask).pooler_output
        clip.train(was_training)
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
