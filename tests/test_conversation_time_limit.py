"""An env episode cut by its time limit (gymnasium `truncated`) in a conversation: recorded as
truncated (`time_limit`) and bootstrapped with the critic's value of the final context, as env
slots do; an episode the env terminated is a `failure` (no success; named as an env slot's)
and gets 0 after its last reply. The episodes
are scored as packed samples (one row holding all their replies), as the trainer scores them."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import gymnasium as gym
import pytest
import torch
from gymnasium.spaces import Discrete, Text
from transformers import AutoModelForCausalLM, AutoTokenizer

from longturn.algo.gae import GAEParams
from longturn.algo.model_set import ModelSet
from longturn.algo.sample_scoring import score_samples
from longturn.engines.base import Completion
from longturn.rollout.samples import samples_from_episodes
from longturn.rollout.conversation_rollout import conversation_rollout
from longturn.tasks.env_frames import EnvInteraction, EnvTask
from settings_from_params import sampling_settings, conversation_settings
from gae_reference import packed_reference
from reference_forward import random_head_critic, state_values

GAE = GAEParams(gamma_step=0.9, lambda_step=0.8, gamma_token=1.0, lambda_token=0.95)


class Corridor(gym.Env):
    """Walk two steps down a corridor."""

    action_names = ["forward", "wait"]
    observation_space = Text(64)
    action_space = Discrete(2)

    def __init__(self, task: str = "goal"):
        self.task, self.t = task, 0  # goal: the end is the goal; time: the time runs out there

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return "you stand at the start", {}

    def step(self, action):
        self.t += 1
        end = self.t >= 2
        goal = end and self.task == "goal"
        return f"you walked {self.t} steps", float(goal), goal, end and not goal, {}


class Forward:
    """An engine that always answers `ACTION: forward`."""

    def __init__(self, tokenizer):
        self.ids = tokenizer.encode("THINK: go. ACTION: forward", add_special_tokens=False) + [
            tokenizer.convert_tokens_to_ids("<|im_end|>")]

    def generate(self, prompt_ids, sampling):
        return [Completion(list(self.ids), [-0.5] * len(self.ids), "stop") for _ in prompt_ids]


@dataclass
class Settings:
    temperature: float = 1.0
    kl_beta: float = 0.05
    kl_estimator: str = "k1"
    mini_batch_size: int = 2
    bf16: bool = False
    share_prefix: bool = False


@pytest.fixture(scope="module")
def episodes(tiny_model_dir):
    """One episode the env terminates and one it truncates, scored with a random critic:
    {ending: (rollout record, scored sample)}, critic."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tasks = [EnvTask(f"{__name__}:Corridor", task, image=False).record(seed=3)
             for task in ("goal", "time")]
    settings = conversation_settings(max_assistant_turns=5, max_user_turns=5,
                                 interaction=EnvInteraction({}, "env"))
    records = conversation_rollout(Forward(tokenizer), tokenizer, sampling_settings(max_new_tokens=32),
                               tasks, settings)
    torch.manual_seed(5)
    actor = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    critic = random_head_critic(tiny_model_dir, 0.5).eval()
    samples = score_samples(samples_from_episodes(records),
                            ModelSet(actor, copy.deepcopy(actor), critic), Settings(), GAE, None,
                            tokenizer.pad_token_id or 0)
    return dict(zip(("terminated", "truncated"), zip(records, samples))), critic


def test_the_time_limit_is_recorded_as_truncated(episodes):
    by_ending, _ = episodes
    assert [(r["termination"], r["truncated"], r["assistant_turns"])
            for r, _ in by_ending.values()] == [("failure", False, 2), ("time_limit", True, 2)]
    # the sample says the same on its last reply
    assert [(s["replies"][-1]["termination"], s["replies"][-1]["truncated"],
             s["replies"][-1]["terminated"], len(s["replies"])) for _, s in by_ending.values()] \
        == [("failure", False, True, 2), ("time_limit", True, False, 2)]


def test_a_truncated_episode_is_bootstrapped_and_a_terminated_one_is_not(episodes):
    by_ending, critic = episodes
    (ended_record, ended), (cut_record, cut) = by_ending["terminated"], by_ending["truncated"]
    assert ended["replies"][-1]["next_value"] is None
    # the final context is the whole episode: the sample's prompt then its response
    assert cut["prompt_ids"] + cut["response_ids"] == cut_record["input_ids"]
    with torch.no_grad():
        v_end = float(state_values(critic, [cut_record["input_ids"]], 0)[0])
    assert cut["replies"][-1]["next_value"] == pytest.approx(v_end, abs=1e-5)
    assert all(r["next_value"] is None for r in cut["replies"][:-1])  # follows from values
    for sample, done, boot in ((ended, True, 0.0), (cut, False, v_end)):
        expected = packed_reference(sample["values"], sample["token_rewards"],
                                    sample["loss_mask"], done, boot, GAE)
        assert sample["advantages"] == pytest.approx(expected, abs=1e-5)
    # the last reply's last token: its reward plus γ_step·V(final context) − V
    last = cut["replies"][-1]["end"] - 1
    assert cut["advantages"][last] == pytest.approx(
        cut["token_rewards"][last] + GAE.gamma_step * v_end - cut["values"][last], abs=1e-5)
