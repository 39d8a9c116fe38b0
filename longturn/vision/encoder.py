"""A vision-language model's frozen image side: vision tower, projector and image processor, kept
in `<model dir>/vision/` beside the language model's plain causal-LM weights.

Why split: every part of longturn (decode loops, shared trunk, LoRA, critic, reference) runs on
causal LMs. A LLaVA-layout model is such an LM whose embedding of each image placeholder token is
replaced by projected image features, so keeping the image side apart, frozen, lets engine and
trainer take images through one embedding hook (`vision.feed`) instead of a second model class.
The tower and projector are not trained: PPO updates the language model only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

VISION_DIR = "vision"  # inside a model dir
IMAGE_PLACEHOLDER = "<image>"  # what messages write where an image goes (one per image)
TOWER_DIR, PROJECTOR_FILE = "tower", "projector.safetensors"


class VisionEncoder:
    """Frames → the LM-sized embeddings that replace an image's placeholder tokens."""

    def __init__(self, tower: torch.nn.Module, projector: torch.nn.Module, processor: Any,
                 config: Any) -> None:
        self.tower = tower.eval().requires_grad_(False)
        self.projector = projector.eval().requires_grad_(False)
        self.processor = processor
        self.feature_layer = config.vision_feature_layer
        self.strategy = config.vision_feature_select_strategy
        if not isinstance(self.feature_layer, int):
            raise ValueError("vision_feature_layer must be one layer index (a list of layers is "
                             "not supported)")
        self.image_token_id = image_token_id(config)
        # measured, not derived from the config: towers differ in whether they have a CLS token
        self.tokens_per_image = 0
        self.tokens_per_image = len(self.encode([np.zeros((8, 8, 3), dtype=np.uint8)]))

    @property
    def placeholder(self) -> tuple[int, int]:
        """(image token id, tokens per image): how ChatDeltas expands each image token."""
        return self.image_token_id, self.tokens_per_image

    @torch.no_grad()
    def encode(self, frames: Sequence[np.ndarray]) -> torch.Tensor:
        """[len(frames) * tokens_per_image, hidden]: every frame's features, in order, encoded
        in one processor call and one tower pass."""
        weight = next(self.projector.parameters())
        if not frames:
            return weight.new_zeros(0, weight.shape[0])
        pixels = self.processor(images=list(frames), return_tensors="pt")["pixel_values"]
        out = self.tower(pixels.to(device=weight.device, dtype=weight.dtype),
                         output_hidden_states=True)
        hidden = out.hidden_states[self.feature_layer]
        if self.strategy == "default":
            hidden = hidden[:, 1:]
        features = self.projector(hidden)
        if self.tokens_per_image and features.shape[1] != self.tokens_per_image:
            raise ValueError(f"the vision tower gave {features.shape[1]} features per image, "
                             f"not {self.tokens_per_image}: frames of other sizes need the "
                             "image processor to resize them")
        return features.reshape(-1, features.shape[-1])


def image_token_id(config: Any) -> int:
    """The placeholder id of a LLaVA config (transformers names it either way)."""
    value = getattr(config, "image_token_id", None)
    if value is None:
        value = getattr(config, "image_token_index", None)
    if value is None:
        raise ValueError("the vision-language config names no image token id")
    return int(value)


def load_vision(model_dir: str | Path, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32) -> VisionEncoder | None:
    """The image side saved with a model, or None for a text-only model."""
    vision = Path(model_dir) / VISION_DIR
    if not (vision / "config.json").is_file():
        return None
    from safetensors.torch import load_file
    from transformers import AutoImageProcessor, AutoModel, LlavaConfig
    from transformers.models.llava.modeling_llava import LlavaMultiModalProjector

    config = LlavaConfig.from_pretrained(vision)
    tower = AutoModel.from_pretrained(vision / TOWER_DIR, dtype=torch.float32)
    projector = LlavaMultiModalProjector(config)
    projector.load_state_dict(load_file(vision / PROJECTOR_FILE), strict=True)
    encoder = VisionEncoder(tower, projector, AutoImageProcessor.from_pretrained(vision), config)
    encoder.tower.to(device=device, dtype=dtype)
    encoder.projector.to(device=device, dtype=dtype)
    return encoder
