"""What a decode loop keeps on the device, and how it turns into Completions at the end.

On a GPU every row keeps decoding until the whole batch has stopped (or max_new_tokens): rows are
never dropped mid-loop, so shapes stay fixed (a CUDA graph can replay the step) and nothing is read
back per token. The CPU loop decodes a shrinking subset of the rows (`record(..., rows)`). Sampled
ids and their logprobs go into [B, N] buffers at the step's column; the host reads "has every row
stopped?" only every few steps, and the buffers once at the end, where each row is cut after its
first end-of-turn token.
"""

from __future__ import annotations

import torch

from longturn.engines.base import Completion, SamplingParams
from longturn.engines.logprobs import token_logprobs
from longturn.engines.sampler import sample_tokens


class DecodeState:
    """Per-row sampled ids / logprobs, stop flags and the step counter, on one device."""

    def __init__(self, rows: int, max_new_tokens: int, stop_ids: torch.Tensor,
                 device: torch.device) -> None:
        self.tokens = torch.zeros(rows, max_new_tokens, dtype=torch.long, device=device)
        self.logprobs = torch.zeros(rows, max_new_tokens, dtype=torch.float32, device=device)
        self.finished = torch.zeros(rows, dtype=torch.bool, device=device)
        self.seeds = torch.zeros(rows, dtype=torch.long, device=device)
        self.step = torch.zeros((), dtype=torch.long, device=device)
        self.steps = 0  # host copy of `step`: columns filled so far
        self.stop_ids = stop_ids.to(device)

    def reset(self, seeds: torch.Tensor) -> None:
        """A new batch (in place, so a captured graph keeps reading the same buffers)."""
        self.tokens.zero_()
        self.logprobs.zero_()
        self.finished.zero_()
        self.seeds.copy_(seeds)
        self.step.zero_()
        self.steps = 0

    def record(self, logits: torch.Tensor, sampling: SamplingParams,
               rows: torch.Tensor | None = None) -> torch.Tensor:
        """Sample this step's token of every row (or of `rows` only, whose logits [len(rows), V]
        these are) from raw logits, store it with its untempered logprob, advance the step;
        returns the tokens. A row's draw depends only on its seed and the step, so sampling a
        subset gives each of its rows what the whole batch would."""
        if rows is None:
            chosen = sample_tokens(logits, sampling, self.seeds, self.step)
            column = self.step.view(1)
            self.tokens.index_copy_(1, column, chosen[:, None])
            self.logprobs.index_copy_(1, column, token_logprobs(logits, chosen)[:, None])
            self.finished |= torch.isin(chosen, self.stop_ids)
        else:
            chosen = sample_tokens(logits, sampling, self.seeds[rows], self.step)
            at = (rows, self.step.expand_as(rows))
            self.tokens.index_put_(at, chosen)
            self.logprobs.index_put_(at, token_logprobs(logits, chosen))
            stopped = self.finished[rows] | torch.isin(chosen, self.stop_ids)
            self.finished.index_put_((rows,), stopped)
        self.step += 1
        return chosen

    def all_finished(self) -> bool:
        """Host read: has every row sampled an end-of-turn token?"""
        return bool(self.finished.all())

    def completions(self) -> list[Completion]:
        """The filled columns, each row cut after its first stop token."""
        steps = self.steps
        tokens = self.tokens[:, :steps].cpu()
        logprobs = self.logprobs[:, :steps].cpu()
        is_stop = torch.isin(tokens, self.stop_ids.cpu())
        stopped = is_stop.any(dim=1)
        ends = torch.where(stopped, is_stop.int().argmax(dim=1) + 1, steps).tolist()
        return [Completion(tokens[row, :end].tolist(), logprobs[row, :end].tolist(),
                           "stop" if stop else "length")
                for row, (end, stop) in enumerate(zip(ends, stopped.tolist()))]


def check_interval(device: torch.device) -> int:
    """Steps between host checks for an all-stopped batch: every step on the CPU (no queue to
    wait for), every 8 on a GPU (a check makes the host wait for the queued steps)."""
    return 1 if device.type == "cpu" else 8
