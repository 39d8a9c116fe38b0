"""The critic: an LM backbone (no LM head) plus a scalar value head, scored per response position.

The critic shares the actor's token layout (engines/logprobs.py: prompts left-padded to a common end
column P, responses right-padded after it), so ``values[k]`` lines up with the logprob of response
token k: both are read from the hidden state of the token *preceding* token k, i.e. columns
P-1 .. P+R-2. ``values[0]`` is therefore V(state) at the last prompt token
(docs/design.md §1, §4).

On disk a critic is a plain HF dir of the backbone (``AutoModel`` loads it) plus
``value_head.safetensors``; a causal-LM dir without that file also loads, with a fresh head,
which is how the critic is "initialised from the base model".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModel

from longturn.algo.lora import merge_and_save
from longturn.engines.logprobs import PackedBatch, forward_packed

VALUE_HEAD_FILE = "value_head.safetensors"


class ValueModel(nn.Module):
    """Backbone hidden states -> float32 scalar value per position."""

    def __init__(self, backbone: nn.Module) -> None:
        """A zero head: V ≡ 0 at start, so an untrained critic adds no noise to the first
        advantages and the warm-up starts from a neutral baseline (the head weight still gets
        gradients: they are the hidden states)."""
        super().__init__()
        self.backbone = backbone
        config = getattr(backbone.config, "text_config", None) or backbone.config
        self.value_head = nn.Linear(int(config.hidden_size), 1, dtype=torch.float32)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, past_key_values: Any = None,
                use_cache: bool = False) -> torch.Tensor:
        """Values [B, T] in float32 (the head runs in its own dtype, float32 unless cast). A
        ``past_key_values`` cache is read and extended in place (shared-prefix scoring)."""
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=position_ids, past_key_values=past_key_values,
                            use_cache=use_cache)
        return self.head_values(out.last_hidden_state)

    def head_values(self, hidden: torch.Tensor) -> torch.Tensor:
        """The value head on final hidden states [..., H] -> float32 values [...]."""
        return self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1).float()

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> ValueModel:
        """Load the backbone (base model part of any causal-LM dir, in float32) and the head if
        saved."""
        model = cls(AutoModel.from_pretrained(str(model_dir), dtype=torch.float32))
        head_path = Path(model_dir) / VALUE_HEAD_FILE
        if head_path.is_file():
            state = load_file(str(head_path))
            model.value_head.load_state_dict({k: v.float() for k, v in state.items()})
        return model

    def save_pretrained(self, out_dir: str | Path, tokenizer: Any | None = None) -> Path:
        """Write a plain HF backbone dir (LoRA merged in) + value head (+ tokenizer files)."""
        out = merge_and_save(self.backbone, out_dir, tokenizer)
        head = self.value_head.state_dict()
        state = {k: v.detach().float().cpu().contiguous() for k, v in head.items()}
        tmp = out / f".{VALUE_HEAD_FILE}.tmp"
        save_file(state, str(tmp))
        tmp.replace(out / VALUE_HEAD_FILE)
        return out


def packed_response_values(critic: ValueModel, batch: PackedBatch) -> torch.Tensor:
    """values [B, R] (V before emitting each response token; masked entries 0) of a packed
    batch (whole-model forward)."""
    width_p, width_r = batch.prompt_width, batch.response_ids.shape[1]
    if width_r == 0:
        return torch.zeros(batch.input_ids.shape[0], 0, device=batch.input_ids.device)
    values = forward_packed(critic, batch)[:, width_p - 1 : width_p + width_r - 1]
    return values.masked_fill(~batch.response_mask, 0.0)


def packed_state_values(critic: ValueModel, batch: PackedBatch) -> torch.Tensor:
    """V(state) [B] at the last prompt token of a batch packed with empty responses: bootstraps
    the next observation at a segment end (whole-model forward)."""
    return forward_packed(critic, batch)[:, -1]
