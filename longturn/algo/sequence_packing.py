"""Sequence-mode episodes in the trainer's packed (prompt, response) layout.

An episode's first context (up to its first reply) is the prompt; everything after it is the
response, whose mask is the loss mask, so tool results and user turns inside it are attended to
but never scored or trained. Scoring (old, reference logprobs, values) and the PPO update then run
on sequences exactly as on turns: one forward pass per episode, not one per reply.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from longturn.engines.logprobs import PackedBatch, pack_prompt_response
from longturn.vision.frames import from_png


def split_sequence(record: dict[str, Any]) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, response ids, the response's loss mask) of one episode record."""
    if not record["segment_starts"]:
        raise ValueError(f"episode {record.get('episode_id')!r} has no reply to train on")
    first = record["segment_starts"][0]
    ids = list(record["input_ids"])
    return ids[:first], ids[first:], [int(m) for m in record["loss_mask"][first:]]


def record_images(record: dict[str, Any]) -> list[tuple[int, Any]]:
    """An episode's frames (PNG bytes in the record) with the start of each one's placeholders
    in `input_ids`; empty for a text-only episode."""
    pngs, starts = record.get("images") or [], record.get("image_starts") or []
    if len(pngs) != len(starts):
        raise ValueError(f"episode {record.get('episode_id')!r}: {len(pngs)} images but "
                         f"{len(starts)} image_starts")
    return [(int(s), from_png(png)) for s, png in zip(starts, pngs)]


def pack_sequences(records: Sequence[dict[str, Any]], pad_id: int,
                   device: str | torch.device = "cpu", share_prefix: bool = False) -> PackedBatch:
    """One row per episode record (`input_ids`, `loss_mask`, `segment_starts`)."""
    prompts, responses, masks = [], [], []
    for r in records:
        prompt, response, mask = split_sequence(r)
        prompts.append(prompt)
        responses.append(response)
        masks.append(mask)
    batch = pack_prompt_response(prompts, responses, pad_id, device, share_prefix)
    loss = torch.zeros_like(batch.response_mask)
    for row, mask in enumerate(masks):
        loss[row, :len(mask)] = torch.tensor(mask, dtype=torch.bool, device=loss.device)
    batch.response_mask = batch.response_mask & loss
    return batch


def unpack_tokens(batch: PackedBatch, records: Sequence[dict[str, Any]],
                  per_token: torch.Tensor) -> list[list[float]]:
    """A [B, R] per-response-token tensor back to per-sequence lists as long as `input_ids`
    (0 on the prompt and on context tokens)."""
    out = []
    for row, r in enumerate(records):
        first = r["segment_starts"][0]
        n = len(r["input_ids"]) - first
        values = (per_token[row, :n] * batch.response_mask[row, :n]).tolist()
        out.append([0.0] * first + values)
    return out
