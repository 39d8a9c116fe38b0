"""Decode with the model's own forward and a growing KV cache: any causal LM transformers loads.

The fallback for model families `static_decoder` does not cover. Prefill is `engines.prefix`
(shared prompt prefix once); each step feeds every row's last token, stopped rows included, so
the loop neither drops rows nor reads anything back per token.
"""

from __future__ import annotations

import torch

from longturn.engines.base import SamplingParams
from longturn.engines.decode_state import DecodeState, check_interval
from longturn.engines.prefix import prefill
from longturn.profiling import DECODE_STEP, mark


class GenericDecoder:
    """Batched sampling on top of `model(input_ids, attention_mask, position_ids, cache)`."""

    def __init__(self, model: torch.nn.Module, pad_id: int, stop_ids: torch.Tensor,
                 device: torch.device, prefix_sharing: bool = True) -> None:
        self.model, self.pad_id, self.stop_ids = model, pad_id, stop_ids
        self.device, self.prefix_sharing = device, prefix_sharing

    def decode(self, prompts: list[list[int]], sampling: SamplingParams,
               seeds: torch.Tensor) -> DecodeState:
        state = DecodeState(len(prompts), sampling.max_new_tokens, self.stop_ids, self.device)
        state.reset(seeds.to(self.device))
        cache, logits, mask, position = prefill(self.model, prompts, self.pad_id, self.device,
                                                self.prefix_sharing)
        every = check_interval(self.device)
        for step in range(sampling.max_new_tokens):
            with mark(DECODE_STEP):  # sampling, the stop check and the next forward
                chosen = state.record(logits, sampling)
                state.steps = step + 1
                last = step == sampling.max_new_tokens - 1
                if last or ((step + 1) % every == 0 and state.all_finished()):
                    break
                mask = torch.cat([mask, mask.new_ones(len(prompts), 1)], dim=-1)
                out = self.model(input_ids=chosen[:, None], attention_mask=mask,
                                 position_ids=position[:, None], past_key_values=cache,
                                 use_cache=True)
                logits, position = out.logits[:, -1, :], position + 1
        return state
