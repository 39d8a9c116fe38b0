"""slime custom generate functions for tests/test_slime_rollout.py, written as slime users write
them (after slime's examples/search-r1 and retool): only the three import lines point here
instead of at slime."""

from __future__ import annotations

import re

# slime: from slime.rollout.sglang_rollout import GenerateState
from longturn.serve.slime_api import GenerateState
# slime: from slime.utils.http_utils import post
from longturn.serve.slime_api import post
# slime: from slime.utils.types import Sample
from longturn.serve.slime_api import Sample

MAX_TURNS = 4


def calculate(text: str) -> tuple[str, bool]:
    """The tool: evaluates the last <calc>a op b</calc>; the observation, and whether done."""
    found = re.findall(r"<calc>(\d+)([+*])(\d+)</calc>", text)
    if not found:
        return "", True
    a, op, b = found[-1]
    value = int(a) + int(b) if op == "+" else int(a) * int(b)
    return f"\n<result>{value}</result>\n", False


async def generate(args, sample: Sample, sampling_params) -> Sample:
    assert not args.partial_rollout, "Partial rollout is not supported."
    state = GenerateState(args)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"

    prompt_text = sample.prompt
    prompt_tokens_ids = state.tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    response = ""
    response_token_ids = []
    loss_mask = []
    rollout_log_probs = []
    sampling_params = {**sampling_params, "stop": ["</calc>"]}

    for _turn in range(MAX_TURNS):
        payload = {"input_ids": prompt_tokens_ids + response_token_ids,
                   "sampling_params": sampling_params, "return_logprob": True}
        output = await post(url, payload)
        if output["meta_info"]["finish_reason"]["type"] == "abort":
            sample.status = Sample.Status.ABORTED
            return sample
        cur_ids = [item[1] for item in output["meta_info"]["output_token_logprobs"]]
        cur_log_probs = [item[0] for item in output["meta_info"]["output_token_logprobs"]]
        response += output["text"]
        response_token_ids += cur_ids
        loss_mask += [1] * len(cur_ids)
        rollout_log_probs += cur_log_probs
        if output["meta_info"]["finish_reason"]["type"] == "length":
            break
        next_obs, done = calculate(output["text"])
        if done:
            break
        obs_ids = state.tokenizer(next_obs, add_special_tokens=False)["input_ids"]
        response += next_obs
        response_token_ids += obs_ids
        loss_mask += [0] * len(obs_ids)
        rollout_log_probs += [0.0] * len(obs_ids)

    sample.tokens = prompt_tokens_ids + response_token_ids
    sample.response_length = len(response_token_ids)
    sample.response = response
    sample.loss_mask = loss_mask
    sample.rollout_log_probs = rollout_log_probs
    match output["meta_info"]["finish_reason"]["type"]:
        case "length":
            sample.status = Sample.Status.TRUNCATED
        case "stop":
            sample.status = Sample.Status.COMPLETED
    return sample


async def generate_with_append(args, sample: Sample, sampling_params) -> Sample:
    """The same loop on slime's newer `append_response_tokens`, prompt sent as text, the reward
    set by the function itself."""
    state = GenerateState(args)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    sample.tokens = state.tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]
    sampling_params = {**sampling_params, "stop": ["</calc>"]}
    for _turn in range(MAX_TURNS):
        output = await post(url, {"text": sample.prompt + sample.response,
                                  "sampling_params": sampling_params, "return_logprob": True})
        pairs = output["meta_info"]["output_token_logprobs"]
        sample.append_response_tokens(args, tokens=[p[1] for p in pairs],
                                      log_probs=[p[0] for p in pairs], trainable=True,
                                      meta_info=output["meta_info"], text=output["text"])
        next_obs, done = calculate(output["text"])
        if done:
            break
        sample.append_response_tokens(
            args, tokens=state.tokenizer(next_obs, add_special_tokens=False)["input_ids"],
            trainable=False, text=next_obs)
    sample.status = Sample.Status.COMPLETED
    sample.reward = 0.25
    return sample


async def raises_after_a_call(args, sample: Sample, sampling_params) -> Sample:
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    await post(url, {"text": sample.prompt, "sampling_params": sampling_params})
    raise RuntimeError("the generate function broke on purpose")


async def bad_request(args, sample: Sample, sampling_params) -> Sample:
    """Sends neither input_ids nor text: the endpoint's 400 is raised by `post`."""
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    await post(url, {"sampling_params": sampling_params})
    return sample


async def hangs(args, sample: Sample, sampling_params) -> Sample:
    import asyncio
    await asyncio.sleep(60)
    return sample


def not_async(args, sample: Sample, sampling_params) -> Sample:
    return sample


async def truncates(args, sample: Sample, sampling_params) -> Sample:
    """One call cut at two tokens: the status slime's examples give a reply that hit its cap."""
    state = GenerateState(args)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    output = await post(url, {"text": sample.prompt, "return_logprob": True,
                              "sampling_params": {**sampling_params, "max_new_tokens": 2}})
    ids = [item[1] for item in output["meta_info"]["output_token_logprobs"]]
    sample.tokens = state.tokenizer(sample.prompt, add_special_tokens=False)["input_ids"] + ids
    sample.response_length, sample.response = len(ids), output["text"]
    if output["meta_info"]["finish_reason"]["type"] == "length":
        sample.status = Sample.Status.TRUNCATED
    return sample
