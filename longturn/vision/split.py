"""A LLaVA-layout Hugging Face dir → a plain causal-LM dir with its image side in `vision/`.

The language model's weights keep their names under a causal LM (`model.*`, `lm_head.weight`), so
every stage loads it as it loads a text-only model; `vision/` holds the tower (its own HF dir),
the projector's weights, the LLaVA config (feature layer, select strategy, image token) and the
image processor. Run once by the base-model stage (`models.prepare_base_model`), which must not
load torch unless it splits (hence the imports inside `split_llava`).
"""

from __future__ import annotations

import json
from pathlib import Path

from longturn.errors import UserError

_LM_PREFIX = "model.language_model."


class VisionModelError(UserError, ValueError):
    """A vision-language model this version cannot split."""


def is_llava_dir(path: str | Path) -> bool:
    """A LLaVA-layout dir; raises for another vision-language layout (it would load as a text
    model, its image side silently dropped)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    found = json.loads(config.read_text())
    if found.get("model_type") == "llava":
        return True
    if "vision_config" in found:
        raise VisionModelError(f"model.source {str(path)!r} is a {found.get('model_type')!r} "
                               "vision-language model; image observations support the LLaVA "
                               "layout (model_type 'llava') only")
    return False


def split_llava(src: str | Path, out_dir: str | Path) -> None:
    """Write `out_dir` (which must not exist) from the LLaVA dir `src`."""
    import torch
    from safetensors.torch import save_file
    from transformers import (AutoImageProcessor, AutoModelForCausalLM, AutoTokenizer,
                              LlavaConfig, LlavaForConditionalGeneration)

    from longturn.vision.encoder import PROJECTOR_FILE, TOWER_DIR, VISION_DIR

    src, out_dir = Path(src), Path(out_dir)
    config = LlavaConfig.from_pretrained(src)
    if not isinstance(config.vision_feature_layer, int):
        raise VisionModelError(f"model.source {str(src)!r}: vision_feature_layer "
                               f"{config.vision_feature_layer!r} lists several layers; only one "
                               "layer is supported")
    vlm = LlavaForConditionalGeneration.from_pretrained(src, dtype=torch.float32)
    lm = AutoModelForCausalLM.from_config(config.text_config, dtype=torch.float32)
    state = {"model." + k[len(_LM_PREFIX):]: v for k, v in vlm.state_dict().items()
             if k.startswith(_LM_PREFIX)}
    state["lm_head.weight"] = vlm.lm_head.weight
    lm.load_state_dict(state, strict=True)
    lm.generation_config = vlm.generation_config
    lm.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(src).save_pretrained(out_dir)
    vision = out_dir / VISION_DIR
    vlm.model.vision_tower.save_pretrained(vision / TOWER_DIR)
    projector = {k: v.contiguous() for k, v in vlm.model.multi_modal_projector.state_dict().items()}
    save_file(projector, vision / PROJECTOR_FILE)
    config.save_pretrained(vision)
    AutoImageProcessor.from_pretrained(src).save_pretrained(vision)
