"""Agents for tests/test_agent_rollout.py, written as an agent author would: the `openai` client
and the base URL they are given, nothing of longturn's."""

from __future__ import annotations

import threading

from openai import OpenAI

RELEASE = threading.Event()  # a hung agent waits on it; the test sets it when done


def one_call(task: dict, base_url: str) -> float:
    """One chat completion, reward 0.5 whatever it said."""
    client = OpenAI(base_url=base_url, api_key="x", max_retries=0)
    client.chat.completions.create(model="any", messages=task["messages"])
    return 0.5


def raises_after_a_call(task: dict, base_url: str) -> float:
    one_call(task, base_url)
    raise RuntimeError("the agent broke on purpose")


def hangs_after_a_call(task: dict, base_url: str) -> float:
    one_call(task, base_url)
    RELEASE.wait(60)
    return 1.0


def says_a_word(task: dict, base_url: str) -> str:
    one_call(task, base_url)
    return "great"  # not a reward


def leaves_the_reward_to_the_task(task: dict, base_url: str) -> None:
    one_call(task, base_url)
    return None


FINAL_ANSWER = "Give your final answer as: ANSWER: <number>"


def asks_for_the_answer(task: dict, base_url: str) -> None:
    """Two calls with a user message of its own between them; the second call's reply capped
    at 3 tokens. The task's own reward."""
    client = OpenAI(base_url=base_url, api_key="x", max_retries=0)
    messages = list(task["messages"])
    reply = client.chat.completions.create(model="any", messages=messages).choices[0].message
    messages += [{"role": "assistant", "content": reply.content or ""},
                 {"role": "user", "content": FINAL_ANSWER}]
    client.chat.completions.create(model="any", messages=messages, max_tokens=3)
    return None
