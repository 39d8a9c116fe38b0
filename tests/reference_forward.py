"""Whole-model forwards on unpacked prompt/response lists: the reference numbers tests compare the
engines, the trainer and ModelSet against (the library packs batches itself); and a critic whose
values are not all zero to compare."""

from __future__ import annotations

import torch

from longturn.algo.critic import ValueModel, packed_response_values, packed_state_values
from longturn.engines.logprobs import pack_prompt_response, response_logits, token_logprobs


def random_head_critic(model_dir: str, std: float) -> ValueModel:
    """The critic at `model_dir` with an N(0, std) head in place of the zero one the library
    starts from, so its values differ between positions."""
    critic = ValueModel.from_pretrained(model_dir)
    torch.nn.init.normal_(critic.value_head.weight, std=std)
    return critic


def response_logprobs_tensor(
    model: torch.nn.Module,
    prompt_ids: list[list[int]],
    response_ids: list[list[int]],
    pad_id: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded [B, R] float32 logprobs of each response token, and its bool mask (for training).

    Masked entries are 0. Gradients flow when called with grad enabled.
    """
    device = next(model.parameters()).device
    batch = pack_prompt_response(prompt_ids, response_ids, pad_id, device)
    if batch.response_ids.shape[1] == 0:
        empty = torch.zeros(len(prompt_ids), 0, device=device)
        return empty, empty.bool()
    logprobs = token_logprobs(response_logits(model, batch), batch.response_ids)
    return logprobs.masked_fill(~batch.response_mask, 0.0), batch.response_mask


def forward_logprobs(model: torch.nn.Module, prompt_ids: list[list[int]],
                     response_ids: list[list[int]]) -> list[list[float]]:
    """Per-sequence lists of response-token logprobs, in inference mode (reference numbers)."""
    if not prompt_ids:
        return []
    with torch.inference_mode():
        logprobs, _ = response_logprobs_tensor(model, prompt_ids, response_ids)
    return [row[: len(resp)] for row, resp in zip(logprobs.cpu().tolist(), response_ids)]


def response_values(critic: ValueModel, prompt_ids: list[list[int]],
                    response_ids: list[list[int]], pad_id: int = 0,
                    share_prefix: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """values [B, R] (V before emitting each response token) and its bool mask [B, R].

    Masked entries are 0. Gradients flow when called with grad enabled.
    """
    device = next(critic.parameters()).device
    batch = pack_prompt_response(prompt_ids, response_ids, pad_id, device, share_prefix)
    return packed_response_values(critic, batch), batch.response_mask


def state_values(critic: ValueModel, prompt_ids: list[list[int]], pad_id: int = 0,
                 share_prefix: bool = False) -> torch.Tensor:
    """V(state) [B] at the last prompt token: bootstraps the next observation at a segment end."""
    device = next(critic.parameters()).device
    batch = pack_prompt_response(prompt_ids, [[] for _ in prompt_ids], pad_id, device,
                                 share_prefix)
    return packed_state_values(critic, batch)
