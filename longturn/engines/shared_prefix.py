"""How many leading tokens a batch of prompts shares, i.e. what is worth computing only once.

Agent prompts start with the same system prompt and worked example (~300 of ~450 tokens), so
both generation (engines/prefix.py) and scoring/training (engines/logprobs.py) run that prefix at
batch size 1 and repeat its KV cache to the batch.
"""

from __future__ import annotations

MIN_SHARED_PREFIX = 16  # below this the second forward call costs more than it saves


def shared_prefix_length(prompts: list[list[int]]) -> int:
    """Tokens worth computing once: the longest common prefix, cut back so every prompt keeps at
    least one token of its own (its last-token logits come from the suffix pass); 0 when that is
    under MIN_SHARED_PREFIX or there is nothing to share with."""
    if len(prompts) < 2:
        return 0
    common = 0
    for column in zip(*prompts):
        if any(token != column[0] for token in column):
            break
        common += 1
    cut = min(common, min(len(p) for p in prompts) - 1)
    return cut if cut >= MIN_SHARED_PREFIX else 0
