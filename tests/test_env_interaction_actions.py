"""An env played through the chat protocol reads each reply as an env slot does and says so: the
reply's sample carries the action columns (raw action, action executed, validity and why not),
a reply that named no valid action counts as invalid in the metrics, and a window's samples and
a whole episode's packed one agree. Tasks without an env leave the columns null."""

from __future__ import annotations

import pickle

import pytest
from transformers import AutoTokenizer

from longturn.engines.base import Completion
from longturn.rollout.conversation import Conversation
from longturn.rollout.conversation_rollout import (chat_deltas, conversation_rollout, lock_step,
                                                   release_all, start_episodes)
from longturn.rollout.sample_metrics import sample_metrics
from longturn.rollout.samples import samples_from_episodes
from longturn.tasks.env_frames import EnvInteraction, EnvTask
from settings_from_params import conversation_settings, sampling_settings

REPLIES = ["THINK: go. ACTION: forward", "I am not sure what to do.", "ACTION: jump",
           "THINK: on. ACTION: right"]


class Scripted:
    """An engine whose n-th call answers every prompt with REPLIES[n] (then the last)."""

    def __init__(self, tokenizer, replies: list[str] = REPLIES):
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.replies = [tokenizer.encode(text, add_special_tokens=False) + [end]
                        for text in replies]
        self.calls = 0

    def generate(self, prompt_ids, sampling):
        ids = self.replies[min(self.calls, len(self.replies) - 1)]
        self.calls += 1
        return [Completion(list(ids), [-0.5] * len(ids), "stop") for _ in prompt_ids]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def replies(tokenizer, history_turns: int | None) -> list[dict]:
    corridor = EnvTask("flaky_envs:FlakyCorridor", "corridor", image=False, kwargs={"length": 9})
    settings = conversation_settings(max_assistant_turns=4, max_user_turns=10,
                                     history_turns=history_turns,
                                     interaction=EnvInteraction({}, "env"))
    records = conversation_rollout(Scripted(tokenizer), tokenizer,
                                   sampling_settings(max_new_tokens=16), [corridor.record(2)],
                                   settings)
    samples = samples_from_episodes(records)
    assert sample_metrics(samples)["valid_action_ratio"] == 0.5
    return [reply for sample in samples for reply in sample["replies"]]


@pytest.mark.parametrize("history_turns", [None, 1])
def test_each_reply_carries_the_action_the_env_read(tokenizer, history_turns):
    got = [(r["raw_action"], r["action"], r["action_valid"], r["action_failure"])
           for r in replies(tokenizer, history_turns)]
    assert got == [("forward", "right", True, None),  # a synonym of the corridor's `right`
                   ("", "right", False, "no_action"),  # the default action, as env slots do
                   ("jump", "right", False, "unknown_action"),
                   ("right", "right", True, None)]


def test_a_task_without_an_env_leaves_the_action_columns_null(tokenizer):
    record = conversation_rollout(Scripted(tokenizer), tokenizer,
                                  sampling_settings(max_new_tokens=16),
                                  [{"task": "t", "seed": 0,
                                    "messages": [{"role": "user", "content": "Say hi."}]}],
                                  conversation_settings())
    (reply,) = samples_from_episodes(record)[0]["replies"]
    assert (reply["raw_action"], reply["action"], reply["action_failure"]) == (None, None, None)
    assert reply["action_valid"] is True  # no tool call of it failed


def test_an_episode_pickled_before_replies_were_read_as_actions_resumes(tokenizer):
    """A checkpoint resumes across an upgrade: a running episode pickled without
    `reply_actions` gets none for its earlier replies, and its next reply is read."""
    corridor = EnvTask("flaky_envs:FlakyCorridor", "corridor", image=False, kwargs={"length": 9})
    settings = conversation_settings(max_assistant_turns=4, max_user_turns=10,
                                     interaction=EnvInteraction({}, "env"))
    engine, sampling = Scripted(tokenizer), sampling_settings(max_new_tokens=16)
    (ep,), _ = start_episodes(chat_deltas(engine, tokenizer, settings), [corridor.record(2)],
                              ["e"], settings)
    lock_step(engine, [ep], settings, sampling, 0)
    state = pickle.loads(pickle.dumps(ep)).__dict__  # as a checkpoint keeps it
    del state["reply_actions"]
    old = Conversation.__new__(Conversation)
    old.__setstate__(state)
    old.deltas = ep.deltas
    lock_step(engine, [old], settings, sampling, 1)
    got = [a and a["action_failure"] for a in old.record()["reply_actions"]]
    assert got == [None, "no_action"]
    release_all([old], settings)


@pytest.mark.parametrize("workers", [False, True])
def test_an_env_with_a_text_action_space_takes_the_reply_as_written(tokenizer, workers):
    """A gymnasium Text action space has no action list: the env interaction reads each reply
    as free text (envs/free_text.py), in this process and in an env worker alike."""
    shout = EnvTask("flaky_envs:GymShout", "door", image=False, kwargs={})
    interaction = EnvInteraction({}, "env")
    interaction.use_env_settings("env.*", workers=workers, step_timeout_s=30.0, max_retries=1,
                                 max_turns=10, invalid_action_penalty=-0.1)
    settings = conversation_settings(max_assistant_turns=4, max_user_turns=10,
                                     history_turns=None, interaction=interaction)
    try:
        engine = Scripted(tokenizer, ["THINK: try. ACTION: OPEN!", "ACTION: open sesame"])
        (record,) = conversation_rollout(engine, tokenizer,
                                         sampling_settings(max_new_tokens=16),
                                         [shout.record(0)], settings)
    finally:
        interaction.close()
    got = [(r["raw_action"], r["action"], r["action_valid"], r["action_failure"])
           for r in samples_from_episodes([record])[0]["replies"]]
    assert got == [("OPEN!", "hello", False, "unknown_action"),  # outside the space's charset
                   ("open sesame", "open sesame", True, None)]
    assert record["success"] is True and record["termination"] == "success"
