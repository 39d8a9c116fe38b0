"""`rollout.slime_generate`: episodes played by a slime custom generate function,
`async def generate(args, sample, sampling_params) -> Sample`, unchanged but for its imports
(serve/slime_api.py). What it is given, and how the Sample it returns becomes one conversation
record of the whole episode: docs/openai-endpoint.md, "slime's generate function".

Each episode's `args` names its own port on the endpoint (serve/native_generate.py: SGLang's
`/generate`, recorded and batched). Every task's coroutine runs at once on one event loop in a
thread; one still running `timeout_s` after the rollout started is cancelled and its episode
aborted, one that raises is aborted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any, Callable

from longturn.engines.base import Engine, SamplingParams
from longturn.rollout.conversation import AGENT_ERROR, AGENT_TIMEOUT as TIMEOUT
from longturn.rollout.conversation import DONE, TOKEN_BUDGET
from longturn.serve.episode_reward import given_reward, task_reward
from longturn.serve.recording import CallRecord, EpisodeNotOpen
from longturn.serve.server import OpenAIServer, serve
from longturn.serve.slime_api import Sample

log = logging.getLogger(__name__)

Generate = Callable[[Any, Sample, dict[str, Any]], Any]
GRACE_S = 5.0  # past the deadline, how long the loop is given to cancel the late ones


def slime_args(host: str, port: int, tokenizer: Any, sampling: SamplingParams,
               max_tokens: int) -> SimpleNamespace:
    """The fields of slime's `args` a generate function reads (docs/openai-endpoint.md)."""
    return SimpleNamespace(
        sglang_router_ip=host, sglang_router_port=port,
        hf_checkpoint=getattr(tokenizer, "name_or_path", None), tokenizer=tokenizer,
        rollout_max_response_len=sampling.max_new_tokens, rollout_max_context_len=max_tokens,
        rollout_temperature=sampling.temperature, rollout_top_p=sampling.top_p,
        rollout_top_k=sampling.top_k, rollout_stop=None, rollout_stop_token_ids=None,
        rollout_skip_special_tokens=False, rollout_seed=sampling.seed, partial_rollout=False,
        n_samples_per_prompt=1, apply_chat_template=True, reward_key=None,
        sampling_params=default_sampling_params(sampling))


def default_sampling_params(sampling: SamplingParams) -> dict[str, Any]:
    """What slime's rollout passes as `sampling_params` (its GenerateState's defaults)."""
    return {"temperature": sampling.temperature, "top_p": sampling.top_p,
            "top_k": sampling.top_k, "max_new_tokens": sampling.max_new_tokens, "stop": None,
            "stop_token_ids": None, "skip_special_tokens": False, "no_stop_trim": True,
            "spaces_between_special_tokens": False}


def slime_rollout(engine: Engine, tokenizer: Any, sampling: SamplingParams,
                  tasks: list[dict[str, Any]], settings: Any, *, generate: Generate,
                  timeout_s: float) -> list[dict[str, Any]]:
    """Play every task with `generate` at once; one record per task, in task order."""
    ids = [f"slime-{i}" for i in range(len(tasks))]
    room = max(1, settings.max_tokens - sampling.max_new_tokens)
    with serve(engine, tokenizer, sampling, max_prompt_tokens=room) as server:
        ports = [server.open_native(episode_id) for episode_id in ids]
        samples = [_sample(i, task, tokenizer) for i, task in enumerate(tasks)]
        args = [slime_args(server.host, port, tokenizer, sampling, settings.max_tokens)
                for port in ports]
        ended: dict[int, tuple[Sample | None, str | None]] = {}
        calls: dict[int, list[CallRecord]] = {}

        async def one(i: int, deadline: float) -> None:
            try:
                out = await asyncio.wait_for(
                    generate(args[i], samples[i], default_sampling_params(sampling)),
                    max(0.0, deadline - time.monotonic()))
                ended[i] = (out, None) if isinstance(out, Sample) else (None, AGENT_ERROR)
                if ended[i][1]:
                    log.warning("slime generate of episode %s returned %s, not a Sample: "
                                "episode aborted", ids[i], type(out).__name__)
            except TimeoutError:
                log.warning("slime generate of episode %s did not return within %g s: "
                            "episode aborted", ids[i], timeout_s)
                ended[i] = (None, TIMEOUT)
            except Exception as err:
                log.warning("slime generate of episode %s raised, episode aborted: %s: %s",
                            ids[i], type(err).__name__, err, exc_info=err)
                ended[i] = (None, AGENT_ERROR)
            calls[i] = await asyncio.to_thread(server.close_episode, ids[i])

        async def all_of_them() -> None:
            deadline = time.monotonic() + timeout_s
            await asyncio.gather(*(one(i, deadline) for i in range(len(tasks))))

        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="slime-generate")
        try:
            pool.submit(asyncio.run, all_of_them()).result(timeout_s + GRACE_S)
        except TimeoutError:  # a generate that blocks its loop: every unfinished one is cut off
            log.warning("slime generate functions blocked their event loop past %g s",
                        timeout_s)
        pool.shutdown(wait=False, cancel_futures=True)
        for i, episode_id in enumerate(ids):
            if i not in calls:
                ended.setdefault(i, (None, TIMEOUT))
                try:
                    calls[i] = server.close_episode(episode_id)
                except EpisodeNotOpen:  # its coroutine closed it meanwhile
                    calls[i] = []
    return [_record(task, *ended[i], calls[i], settings.reward_fn, server)
            for i, task in enumerate(tasks)]


def _sample(i: int, task: dict[str, Any], tokenizer: Any) -> Sample:
    messages = list(task.get("messages") or [])
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    answer = task.get("answer")
    return Sample(group_index=i, index=i, prompt=prompt,
                  label=None if answer is None else str(answer), metadata=dict(task))


def _replies(mask: list[int]) -> tuple[list[int], list[int]]:
    """The runs of 1 in a loss mask, as (starts, ends)."""
    starts, ends = [], []
    for k, bit in enumerate(mask):
        if bit and (k == 0 or not mask[k - 1]):
            starts.append(k)
        if bit and (k == len(mask) - 1 or not mask[k + 1]):
            ends.append(k + 1)
    return starts, ends


def _checked(sample: Sample) -> str | None:
    """Why the Sample cannot be read as an episode, or None."""
    tokens, n = sample.tokens, sample.response_length
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        return "sample.tokens is not a list of token ids"
    if not 0 <= n <= len(tokens):
        return f"sample.response_length {n} is not within its {len(tokens)} tokens"
    if sample.loss_mask is not None and len(sample.loss_mask) != n:
        return f"sample.loss_mask has {len(sample.loss_mask)} entries for {n} response tokens"
    return None


def _matched_calls(ids: list[int], starts: list[int], ends: list[int],
                   calls: list[CallRecord]) -> list[tuple[int, CallRecord]]:
    """(where it begins, the call) of each recorded call whose response ids make up the replies,
    in order: a reply the function rewrote matches none."""
    queue = [c for c in calls if c.response_ids]
    out = []
    for start, end in zip(starts, ends):
        pos = start
        while queue and pos < end and ids[pos:pos + len(queue[0].response_ids)] == \
                queue[0].response_ids:
            call = queue.pop(0)
            out.append((pos, call))
            pos += len(call.response_ids)
    return out


def _logprobs(ids: list[int], own: list[float] | None, matched: list[tuple[int, CallRecord]]
              ) -> list[float]:
    """The engine's logprob of each token: `own` (the Sample's, over its response), else those
    of the recorded calls whose response ids make up the replies (`_matched_calls`); 0 where
    none matches."""
    out = [0.0] * len(ids)
    if own is not None:
        out[len(ids) - len(own):] = [float(v) for v in own]
        return out
    for pos, call in matched:
        out[pos:pos + len(call.response_ids)] = call.logprobs
    return out


def _record(task: dict[str, Any], sample: Sample | None, aborted: str | None,
            calls: list[CallRecord], reward_fn: Any, server: OpenAIServer) -> dict[str, Any]:
    problem = _checked(sample) if sample is not None else None
    if problem is not None:
        log.warning("slime generate of task %s seed %s: %s: episode aborted", task.get("task"),
                    task.get("seed"), problem)
        aborted = AGENT_ERROR
    status = sample.status if sample is not None else None
    if aborted is None and status in (Sample.Status.ABORTED, Sample.Status.FAILED):
        aborted = AGENT_ERROR
    first = list(task.get("messages") or [])
    if aborted is not None or sample is None:
        ids, response, own = server.renderer.render(first, [])[1], "", None
        mask = [0] * len(ids)
    else:
        ids, n = list(sample.tokens), sample.response_length
        replies = sample.loss_mask if sample.loss_mask is not None else [1] * n
        mask = [0] * (len(ids) - n) + [int(bool(b)) for b in replies]
        own = sample.rollout_log_probs
        own = own if own is not None and len(own) == n else None
        response = sample.response or server.tokenizer.decode(ids[len(ids) - n:],
                                                              skip_special_tokens=True)
    starts, ends = _replies(mask)
    messages = first + ([{"role": "assistant", "content": response}] if response else [])
    reward = None
    if aborted is None:  # sample.reward when the function set one, else the task's reward
        reward, aborted = given_reward(sample.reward, "slime generate")
        if reward is None and aborted is None:
            reward, aborted = task_reward(reward_fn, task, messages)
    truncated = aborted is None and status is Sample.Status.TRUNCATED
    nreplies = len(starts)
    matched = _matched_calls(ids, starts, ends, calls)
    # per reply, the engine's finish reason of the matched call that ends it (None: no call's
    # response ids account for its end)
    ending = {pos + len(call.response_ids): call.finish_reason for pos, call in matched}
    return {
        "input_ids": ids, "loss_mask": mask, "engine_logprobs": _logprobs(ids, own, matched),
        "segment_starts": starts, "segment_ends": ends,
        "segment_rewards": [0.0] * (nreplies - 1) + [reward or 0.0] if nreplies else [],
        "reply_finish_reasons": [ending.get(end) for end in ends],
        "reward": float(reward or 0.0),
        "termination": aborted or (TOKEN_BUDGET if truncated else DONE),
        "truncated": truncated, "aborted": aborted is not None, "assistant_turns": nreplies,
        # not known: a Sample's inserted tokens do not say which were tool results, user turns
        # or failed calls, and a guess would read as measured (tool_call_validity 1.0)
        "user_turns": None, "tool_calls": None, "tool_errors": None,
        "tokenization_check": "skipped", "messages": json.dumps(messages),
        "metrics": json.dumps({"engine_calls": len(calls)}), "images": [], "image_starts": [],
    }
