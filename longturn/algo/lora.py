"""Optional LoRA for the actor (causal LM) and the critic (ValueModel backbone), via peft.

Saved checkpoints are always plain HF dirs with the LoRA update merged in, so inference engines
(transformers, SGLang) and the next stage load them without peft.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

from torch import nn


def apply_lora(model: nn.Module, r: int = 8, alpha: float = 16.0,
               top_layers: int | None = None) -> nn.Module:
    """Freeze the base weights and add trainable LoRA adapters; returns the model to train.

    A causal LM comes back as a ``PeftModelForCausalLM`` (same forward signature). A ValueModel is
    returned itself, its ``backbone`` wrapped in place: the value head stays fully trainable, since
    a fresh head has nothing a low-rank update could build on. Adapters go on every linear
    layer except the LM output layer (peft's ``"all-linear"``).

    ``top_layers=N`` puts adapters on the last N transformer layers only. Nothing below them
    needs a gradient then, so backward stops at layer L-N: on CPU that is most of its cost.
    """
    from peft import LoraConfig, TaskType, get_peft_model

    is_critic = isinstance(getattr(model, "backbone", None), nn.Module)  # a ValueModel
    base = model.backbone if is_critic else model
    layers = _top_layer_indices(base, top_layers)
    # peft wants the layers' names (not "all-linear") when adapters go on some layers only
    targets = "all-linear" if layers is None else _linear_names(base)
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=targets,
                        task_type=None if is_critic else TaskType.CAUSAL_LM,
                        layers_to_transform=layers,
                        layers_pattern="layers" if layers is not None else None)
    # without the FutureWarning every train stage printed: peft 0.21 reads
    # `is_gradient_checkpointing`, an alias transformers 5 deprecates (nothing of ours to change)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                category=FutureWarning)
        wrapped = get_peft_model(base, config)
    if not is_critic:
        return wrapped
    model.backbone = wrapped
    for param in model.value_head.parameters():
        param.requires_grad_(True)
    return model


def _linear_names(model: nn.Module) -> list[str]:
    """Leaf names of every linear layer except the LM output layer (what "all-linear" means)."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                   if isinstance(module, nn.Linear) and module is not output})


def _top_layer_indices(model: nn.Module, top_layers: int | None) -> list[int] | None:
    """Indices of the last `top_layers` transformer layers (None: every layer, as is asking for
    at least as many layers as the model has)."""
    if top_layers is None:
        return None
    config = getattr(model.config, "text_config", None) or model.config
    total = int(config.num_hidden_layers)
    return None if top_layers >= total else list(range(total - top_layers, total))


def merged_state_dict(model: nn.Module) -> dict[str, Any]:
    """The weights a plain copy of the model would have, LoRA folded in, named as in the base
    model (no `base_layer`, no adapter tensors), without copying the model: the in-memory
    weight push to an inference engine after each update. Tensors stay where the model is."""
    from peft import PeftModel
    from peft.tuners.tuners_utils import BaseTunerLayer

    if not isinstance(model, PeftModel):
        return {k: v.detach() for k, v in model.state_dict().items()}
    base = model.get_base_model()
    out: dict[str, Any] = {}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        out[name.replace(".base_layer.", ".")] = tensor.detach()
    for name, module in base.named_modules():
        if isinstance(module, BaseTunerLayer) and not module.disable_adapters:
            weight = module.get_base_layer().weight.detach()
            for adapter in module.active_adapters:
                if adapter in getattr(module, "lora_A", {}):
                    weight = weight + module.get_delta_weight(adapter).detach()
            out[f"{name}.weight"] = weight
    return out


def merge_and_save(model: nn.Module, out_dir: str | Path, tokenizer: Any | None = None) -> Path:
    """Save a model as a plain HF dir (LoRA folded in) that transformers or an engine loads.

    Merges into a deep copy (peft's own ``merge_and_unload``, so every LoRA variant is handled
    exactly) instead of merge/unmerge in place, which would leave round-off in the trained base
    weights after every save (bad in bf16). Costs one extra copy of the weights while saving.
    """
    from peft import PeftModel

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    merged = copy.deepcopy(model).merge_and_unload() if isinstance(model, PeftModel) else model
    merged.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out
