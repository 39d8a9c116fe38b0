"""`rollout.agent`: episodes played by the user's own agent code through the OpenAI chat API.

An agent is a function `agent(task, base_url) -> reward` (`package.module:function`; its contract:
docs/openai-endpoint.md, "The agent's contract") that plays one episode against the
OpenAI-compatible endpoint serving the policy (serve/server.py). It never hands tokens back: the
endpoint records every call's prompt ids, response ids and logprobs under the episode id in the
URL.

Why each call is its own sample: a call's context is exactly what the agent sent, which need not
be a prefix of the next call's (agents drop, summarise and rewrite history), so the episode is
recorded the way a history window is (`window_prompts`, one reply per call, chained by slot and
lock-step), and the chat protocol's scoring, dual-discount GAE, group estimators, Parquet,
report and audit take it unchanged (rollout/samples.py `samples_from_window`).

The episodes of one call of this rollout play at once, each agent in a thread of its own; their
calls are gathered into engine batches by the endpoint. An agent that raises, or that has not
returned `agent_timeout_s` after the rollout started, ends its episode aborted (`agent_error`,
`timeout`): its calls stay in the record but out of every loss, and the run goes on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Callable

from tqdm.auto import tqdm

from longturn.engines.base import Engine, SamplingParams
from longturn.rollout.conversation import AGENT_ERROR, AGENT_TIMEOUT as TIMEOUT, replies_valid
from longturn.serve.episode_reward import Outcome, RewardFn, given_reward, task_reward
from longturn.serve.recording import CallRecord
from longturn.serve.server import serve
from longturn.tasks.tools import is_error_text

log = logging.getLogger(__name__)

Agent = Callable[[dict[str, Any], str], Any]


def agent_rollout(engine: Engine, tokenizer: Any, sampling: SamplingParams,
                  tasks: list[dict[str, Any]], settings: Any, *, agent: Agent,
                  timeout_s: float) -> list[dict[str, Any]]:
    """Play every task with `agent` at once; one record per task, in task order (bound to an
    agent by `ConversationRun.from_params`, then called as any rollout function)."""
    ids = [f"agent-{i}" for i in range(len(tasks))]
    quiet_http_clients()
    # rollout.chat.max_tokens bounds a call's prompt and reply together, as it bounds a window's
    room = max(1, settings.max_tokens - sampling.max_new_tokens)
    with serve(engine, tokenizer, sampling, max_prompt_tokens=room) as server:
        urls = [server.open_episode(episode_id) for episode_id in ids]
        pool = ThreadPoolExecutor(max_workers=max(1, len(tasks)), thread_name_prefix="agent")
        futures = {pool.submit(agent, dict(task), url): i
                   for i, (task, url) in enumerate(zip(tasks, urls))}
        calls, outcomes = _collect(futures, ids, server.close_episode, timeout_s,
                                   settings.progress)
        pool.shutdown(wait=False, cancel_futures=True)  # a hung agent's thread is left behind
    return [_record(task, calls[i], outcomes[i], settings.reward_fn, server.renderer)
            for i, task in enumerate(tasks)]


def quiet_http_clients() -> None:
    """The agents' HTTP clients log every call at INFO: warnings only."""
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger(name).level))


def _collect(futures: dict[Future, int], ids: list[str],
             close: Callable[[str], list[CallRecord]], timeout_s: float, progress: bool
             ) -> tuple[dict[int, list[CallRecord]], dict[int, Outcome]]:
    """Each episode's calls and outcome, closing it on the endpoint as soon as its agent ends
    (the batcher stops waiting for it), and every one still running at the deadline."""
    calls: dict[int, list[CallRecord]] = {}
    outcomes: dict[int, Outcome] = {}
    deadline = time.monotonic() + timeout_s
    pending = set(futures)
    bar = tqdm(total=len(futures), desc="agents", unit="ep", disable=not progress, leave=False)
    while pending:
        done, pending = wait(pending, timeout=max(0.0, deadline - time.monotonic()),
                             return_when="FIRST_COMPLETED")
        if not done:  # the deadline: every agent still running is cut off
            for future in pending:
                i = futures[future]
                calls[i], outcomes[i] = close(ids[i]), (None, TIMEOUT)
                log.warning("agent of episode %s did not return within %g s: episode aborted",
                            ids[i], timeout_s)
            break
        for future in done:
            i = futures[future]
            calls[i], outcomes[i] = close(ids[i]), _outcome(future, ids[i])
            bar.update(1)
    bar.close()
    return calls, outcomes


def _outcome(future: Future, episode_id: str) -> Outcome:
    """The agent's reward; an exception or a reward that is not a finite number aborts."""
    error = future.exception()
    if error is not None:
        log.warning("agent of episode %s raised, episode aborted: %s: %s", episode_id,
                    type(error).__name__, error, exc_info=error)
        return None, AGENT_ERROR
    return given_reward(future.result(), f"the agent of episode {episode_id}")


def _digest(ids: list[int]) -> str:
    return "prompt " + hashlib.sha256(repr(list(ids)).encode()).hexdigest()[:24]


def _added(task: dict[str, Any], messages: list[dict[str, Any]]) -> Counter:
    """(role, content) → how many such messages the agent's conversation has beyond the task's
    own first messages: the task's question, and a worked example's turns, are not the
    episode's."""
    def count(of: list[dict[str, Any]]) -> Counter:
        return Counter((m.get("role"), str(m.get("content"))) for m in of)
    return count(messages) - count(task.get("messages") or [])


def _record(task: dict[str, Any], calls: list[CallRecord], outcome: Outcome,
            reward_fn: RewardFn | None, renderer: Any, first: int = 0, step: int = 0,
            bootstrap: list[int] | None = None) -> dict[str, Any]:
    """A conversation record of the calls `calls[first:]` (all of them but for a fixed-turn
    portion: serve/agent_turns.py), one reply each with its prompt as its window (the columns
    `Conversation.record` writes with a history window), the k-th at lock-step `step + k`. With
    `bootstrap` (the prompt of the episode's next call) the episode goes on: the record is `cut`
    and its last reply bootstraps from that prompt."""
    # in this project's format, as tasks read them: every content a string (an OpenAI client
    # leaves it out, or null, on a reply that is only tool calls)
    messages = [{**m, "content": m.get("content") or ""} for m in (
        [*calls[-1].messages, calls[-1].reply] if calls else task.get("messages") or [])]
    reward, aborted = outcome
    if reward is None and aborted is None and bootstrap is None:
        reward, aborted = task_reward(reward_fn, task, messages)
    tool_calls = sum(len(c.reply.get("tool_calls") or []) for c in calls)
    added = _added(task, messages)
    user_turns = sum(n for (role, _), n in added.items() if role == "user")
    # failed tool calls, by the rule the built-in rollout counts with (tasks/tools.py)
    tool_errors = sum(n for (role, text), n in added.items()
                      if role == "tool" and is_error_text(text))
    valid = replies_valid(messages, len(calls))[first:]  # the agent ran its tools: its messages
    whole, calls = len(calls), calls[first:]
    # the context before the first reply is what the first call sent (no call answered: the
    # task's first prompt), out of the loss, so a packed sample's prompt is what the model saw
    ids = list(calls[0].prompt_ids) if calls else renderer.render(messages, [])[1]
    mask, logprobs = [0] * len(ids), [0.0] * len(ids)
    starts, ends = [], []
    for call in calls:
        starts.append(len(ids))
        ids += call.response_ids
        mask += [1] * len(call.response_ids)
        logprobs += call.logprobs
        ends.append(len(ids))
    n = len(calls)
    return {
        "input_ids": ids, "loss_mask": mask,
        "engine_logprobs": logprobs, "segment_starts": starts, "segment_ends": ends,
        "segment_rewards": [0.0] * (n - 1) + [reward or 0.0] if n else [],
        "reply_finish_reasons": [c.finish_reason for c in calls], "reply_valid": valid,
        "reward": float(reward or 0.0),
        "termination": None if bootstrap is not None else aborted or "done",
        "truncated": False, "aborted": aborted is not None, "assistant_turns": whole,
        "user_turns": user_turns, "tool_calls": tool_calls, "tool_errors": tool_errors,
        "tokenization_check": "skipped", "messages": json.dumps(messages),
        "metrics": json.dumps({}), "images": [], "image_starts": [],
        "reply_steps": list(range(step, step + n)), "first_turn": first,
        "window_prompts": [list(c.prompt_ids) for c in calls],
        # GiGPO's anchor state of a call: exactly what it sent (a digest: prompts are long)
        "reply_observations": [_digest(c.prompt_ids) for c in calls],
        "window_frames": [[] for _ in calls], "window_image_starts": [[] for _ in calls],
        **({} if bootstrap is None else {
            "cut": True, "bootstrap_prompt_ids": list(bootstrap), "bootstrap_frames": [],
            "bootstrap_image_starts": [],  # the episode's own columns come with its last part
            **dict.fromkeys(("messages", "metrics", "tool_calls", "tool_errors", "user_turns",
                             "assistant_turns", "tokenization_check"))}),
    }
