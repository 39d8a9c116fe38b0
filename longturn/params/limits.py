"""Upper bounds of the sizes and counts in params.yaml, each with the reason it cannot be exceeded.

Why: a count such as `train.iterations: 10**30` or `engine.sampling.max_new_tokens: 10**12`
passed validation and died a minute later inside the torch allocator. Each bound here is far
above every shipped profile and below what any run could hold or finish; `params/config.py` applies
them (`at_most`) and quotes `why` in the one-line error. Bounds that depend on the model (its
context length) are checked by `longturn/run/preflight.py` from the model dir's config.json.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field


@dataclass(frozen=True)
class Limit:
    """A bound and why nothing above it can run."""

    value: int
    why: str


# The longest context of the models longturn targets (Qwen2.5 and Llama 3.1: 128k positions).
CONTEXT_TOKENS = Limit(2**17, "the longest model context longturn supports (2^17 positions)")
# Positions in one forward (decode batch × (prompt + reply), micro-batch × row): the KV cache of
# the smallest shipped model (SmolLM2-135M: 30 layers × 3 KV heads × 64 dims × K,V in bf16 =
# 23 KiB a position) for 2^23 positions is 193 GB, more than one GPU holds (H200: 141 GB).
FORWARD_TOKENS = Limit(2**23, "2^23 positions in one forward: their KV cache alone outgrows a "
                              "GPU even for SmolLM2-135M")
# Positions one rank keeps as rows at once (an iteration's batch; every warm-up batch): 60x the
# largest shipped profile (gpu1's warm-up: 4.4M); at ~100 bytes a position once rows are scored
# into tensors, 2^28 positions are ~27 GB of one rank's memory.
HELD_TOKENS = Limit(2**28, "2^28 token positions held by one rank (~27 GB of rows and tensors)")
# Env slots of one rank: with env.workers each is a process (a BabyAI worker peaks at 61 MiB),
# so 4,096 of them need 244 GiB, more than a pod of the shipped profiles (64 GiB a rank).
ENV_SLOTS = Limit(4096, "4,096 env slots per rank (one worker process each, ~61 MiB)")
# Rows of a decode batch, a mini-batch or a micro-batch; no more than a rank's env slots times
# the turns of an iteration fit HELD_TOKENS anyway.
BATCH_ROWS = Limit(2**16, "65,536 rows in one batch")
# An iteration takes seconds at least (gpu1 on an H100: 22 s): 10^6 of them run for months.
ITERATIONS = Limit(10**6, "10^6 iterations (months of compute at seconds each)")
# Episodes per task of one evaluation or validation: all their rows are kept for the Parquet.
EPISODES = Limit(10**7, "10^7 episodes per task (every episode's rows are kept)")
# Turns of one episode (Crafter's own limit is 10,000).
EPISODE_TURNS = Limit(10**6, "10^6 turns in one episode")
# Seeds (seed, eval.seed, validation.seed): env resets take `eval.seed + i` for episode i < 10^7
# of a task, and a reset seed must be below 2^32 (numpy RandomState's range; torch.manual_seed
# refuses 2^64), so a seed leaves 10^7 of room under 2^32. The collectors hash `seed` into 32-bit
# reset seeds and sampling seeds are folded to 63 bits, so no other sum of a seed can overflow.
SEED = Limit(2**32 - 1 - EPISODES.value,
             f"{2**32 - 1 - EPISODES.value:,}, so seed + episode index (< 10^7) stays below "
             "2^32, numpy RandomState's range that env resets are seeded from")
# Passes over one batch, and env failures in a row: PPO uses 1-10 epochs; a slot that failed
# 1,000 times in a row will not recover.
REPEATS = Limit(1000, "1,000 repeats")
# top_k counts vocabulary entries: no tokenizer has 2^20 (Gemma's has 256k).
VOCABULARY = Limit(2**20, "2^20 tokens, more than any vocabulary")
# LoRA rank and depth: no model has a hidden size of 2^16 (Llama 3.1 405B: 16,384) or 1,024
# layers (the same: 126).
HIDDEN_SIZE = Limit(2**16, "2^16, more than any model's hidden size")
LAYERS = Limit(1024, "1,024 layers, more than any model has")
# Characters of one tool response: beyond 16 a token of the longest context it can never fit.
TOOL_RESPONSE_CHARS = Limit(16 * 2**17, "16 characters a position of the longest context")
# Seconds one tool or interaction call may take: a lock-step's replies wait for its slowest call,
# so a call of an hour stalls every episode of the batch for that hour.
TOOL_SECONDS = Limit(3600, "an hour: every episode of a lock-step waits for its slowest call")
# GPUs of one pod, or of one SGLang server's tensor parallelism: a node has at most 16.
NODE_GPUS = Limit(16, "16 GPUs, the most one node has")


def at_most(limit: Limit, default: Any, **kwargs: Any) -> Any:
    """A pydantic Field bounded by `limit`, whose reason `config._describe` quotes."""
    return Field(default, le=limit.value, json_schema_extra={"why": limit.why}, **kwargs)
