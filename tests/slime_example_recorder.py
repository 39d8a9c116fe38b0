"""examples/slime_calculator_generate.py with what it saw written down, for
tests/test_slime_pipeline.py: each episode's /generate answers and the Sample it returned, one
JSON line per episode in `slime_generated.jsonl` of the working directory (the stage's).

Why stop token ids: a tiny random model almost never ends a reply before its token cap, and a
capped reply ends the example's episode; stopping on half the vocabulary ends replies after a
few tokens, so each episode runs the example's whole loop (reply, inserted turn, reply ...).
"""

from __future__ import annotations

import json
from pathlib import Path

import examples.slime_calculator_generate as example

OUT = Path("slime_generated.jsonl")
ANSWERS: dict[str, list[list[int]]] = {}  # by URL: each episode has a port of its own
_post = example.post


async def _recording_post(url, payload, **kwargs):
    answer = await _post(url, payload, **kwargs)
    ANSWERS[url].append(answer["output_ids"])
    return answer


example.post = _recording_post


async def generate(args, sample, sampling_params):
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    ANSWERS[url] = []
    stops = list(range(0, len(args.tokenizer), 2))
    sample = await example.generate(args, sample, {**sampling_params, "stop_token_ids": stops})
    with OUT.open("a") as f:
        f.write(json.dumps({"tokens": sample.tokens, "loss_mask": sample.loss_mask,
                            "response_length": sample.response_length,
                            "outputs": ANSWERS.pop(url)}) + "\n")
    return sample
