"""A slime custom generate function for longturn's arithmetic problems, written as slime's
multi-turn examples (examples/retool, examples/search-r1) write theirs: sample until the model
closes a calculator call, run the call, append its result as tokens the loss leaves out, repeat;
a reply with neither a call nor an ANSWER line is told so, as search-r1 tells an invalid action.

Only the three import lines differ from a file slime runs. The reward is left to the task (1 for
the right `ANSWER:` in `sample.response`). Observations are ChatML turns (SmolLM2, Qwen), as
retool's template writes them. Train it with the `slime` profile:
`make params PROFILE=slime && .venv/bin/dvc exp run -n slime` (docs/openai-endpoint.md).
"""

from __future__ import annotations

import json
import re

from examples.react_calculator_agent import calculate
# slime: from slime.rollout.sglang_rollout import GenerateState
from longturn.serve.slime_api import GenerateState
# slime: from slime.utils.http_utils import post
from longturn.serve.slime_api import post
# slime: from slime.utils.types import Sample
from longturn.serve.slime_api import Sample

MAX_TURNS = 3
TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)
INVALID = "Call the calculator, or end with a line 'ANSWER: <number>'."


def execute_predictions(text: str, eos: str) -> tuple[str, bool]:
    """The observation after a reply (a ChatML tool or user turn), and whether the episode ends."""
    found = TOOL_CALL.search(text)
    if found is None and re.search(r"ANSWER\s*:", text, re.IGNORECASE):
        return "", True
    try:
        role, content = "tool", calculate(json.loads(found.group(1))["arguments"]["expression"])
    except (AttributeError, ValueError, KeyError, TypeError):  # no call, or a malformed one
        role, content = "user", INVALID
    close = "" if text.endswith(eos) else eos  # a stop at </tool_call> left the turn open
    return f"{close}\n<|im_start|>{role}\n{content}{eos}\n<|im_start|>assistant\n", False


async def generate(args, sample: Sample, sampling_params) -> Sample:
    assert not args.partial_rollout, "Partial rollout is not supported."
    state = GenerateState(args)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    sample.tokens = state.tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]
    sample.response, sample.response_length, sample.loss_mask = "", 0, []
    sample.rollout_log_probs = None
    sampling_params = {**sampling_params, "stop": ["</tool_call>"]}

    for turn in range(MAX_TURNS):
        output = await post(url, {"input_ids": sample.tokens, "return_logprob": True,
                                  "sampling_params": sampling_params})
        finish = output["meta_info"]["finish_reason"]["type"]
        if finish == "abort":
            sample.status = Sample.Status.ABORTED
            return sample
        pairs = output["meta_info"]["output_token_logprobs"]
        sample.append_response_tokens(args, tokens=[p[1] for p in pairs],
                                      log_probs=[p[0] for p in pairs], trainable=True,
                                      meta_info=output["meta_info"], text=output["text"])
        sample.status = Sample.Status.COMPLETED
        if finish == "length":
            sample.status = Sample.Status.TRUNCATED
            break
        next_obs, done = execute_predictions(output["text"], state.tokenizer.eos_token)
        if done or turn == MAX_TURNS - 1:
            break
        obs_token_ids = state.tokenizer(next_obs, add_special_tokens=False)["input_ids"]
        room = args.rollout_max_context_len - args.rollout_max_response_len
        if len(sample.tokens) + len(obs_token_ids) > room:  # no room left for another reply
            sample.status = Sample.Status.TRUNCATED
            break
        sample.append_response_tokens(args, tokens=obs_token_ids, trainable=False, text=next_obs)
    return sample
