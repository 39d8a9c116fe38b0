"""`rollout.agent` under a critic: fixed-turn batches of agent calls that carry episodes across
iterations. A scripted agent (the real `openai` client over the loopback) plays against the tiny
model; the call after a slot's quota is held, bootstraps the cut record, and is answered by the
updated weights as the slot's first call of the next iteration."""

from __future__ import annotations

import copy
import time
from concurrent.futures import wait
from types import SimpleNamespace

import pytest
import torch
from openai import OpenAI
from transformers import AutoModelForCausalLM, AutoTokenizer

import agents_for_tests
from endpoint_engines import ScriptedEngine
from reference_forward import random_head_critic
from longturn.algo.gae import GAEParams
from longturn.algo.model_set import ModelSet
from longturn.algo.sample_scoring import score_samples
from longturn.engines.base import SamplingParams
from longturn.engines.hf import HFEngine
from longturn.errors import SettingError
from longturn.params.config import parse_params
from longturn.params.sizes import iteration_rows
from longturn.rollout.collection import EpisodeGroups
from longturn.rollout.conversation_setup import ConversationRun
from longturn.rollout.samples import samples_from_episodes
from longturn.run.wiring import make_collector
from longturn.serve.agent_turns import AgentTurnCollector

SAMPLING = SamplingParams(max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=0, seed=3)
GAE = GAEParams(gamma_step=0.9, lambda_step=0.8, gamma_token=0.99, lambda_token=0.95)
N_ENVS, TURNS, CALLS = 2, 2, 3  # an episode of 3 calls spans two iterations of 2


def three_calls(task: dict, base_url: str) -> float:
    client = OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=60)
    messages = list(task["messages"])
    for k in range(CALLS):
        reply = client.chat.completions.create(model="p", messages=messages).choices[0].message
        messages += [{"role": "assistant", "content": reply.content or ""},
                     {"role": "user", "content": f"go on ({k})"}]
    return 1.0


class VersionedEngine:
    """The tiny model's engine; counts weight pushes and keeps which version answered each
    prompt."""

    def __init__(self, inner: HFEngine):
        self.inner, self.version, self.answered = inner, 0, []

    def generate(self, prompt_ids, sampling):
        self.answered += [(list(p), self.version) for p in prompt_ids]
        return self.inner.generate(prompt_ids, sampling)

    def load_weights(self, state) -> None:
        self.inner.load_weights(state)
        self.version += 1


def _params(advantage: str = "gae"):
    return parse_params({"env": {"tasks": ["arithmetic_plain"]}, "algo": {"advantage": advantage,
                         "group_size": 2}, "rollout": {"protocol": "chat", "n_envs": N_ENVS,
                         "agent": "agents_for_tests:one_call"}})


def test_the_estimator_picks_fixed_turn_agents_with_a_critic_and_whole_groups_without():
    params = _params()
    assert isinstance(make_collector(params, 0, "t"), AgentTurnCollector)
    assert iteration_rows(params) == [("rollout.n_envs", N_ENVS), ("rollout.turns_per_env", 8)]
    params = _params("grpo")
    assert isinstance(make_collector(params, 0, "t"), EpisodeGroups)


def test_a_resumed_collector_starts_fresh_episodes_with_the_counters_it_saved():
    run = ConversationRun.from_params(_params(), progress=False)

    def collector(n_envs: int) -> AgentTurnCollector:
        return AgentTurnCollector(run, three_calls, 4.0, ["arithmetic_plain"], n_envs, TURNS,
                                  seed=1)
    saved = collector(N_ENVS)
    saved.episode_counts = [3, 5]
    resumed = collector(N_ENVS)
    resumed.load_state(saved.state())
    assert resumed.episode_counts == [3, 5] and resumed.slots == [None, None]
    with pytest.raises(SettingError, match="resume with the same rollout.n_envs"):
        collector(3).load_state(saved.state())


def test_failing_agents_abort_their_own_episodes_and_the_slot_goes_on(smollm2_tokenizer_dir):
    """An agent that raises after a call ends its episode aborted, and the slot's next episode
    takes the next step; one that returns without a call counts a step, so it cannot spin."""
    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    engine = ScriptedEngine(tokenizer, lambda prompt: "ANSWER: 1")
    run = ConversationRun.from_params(_params(), progress=False)
    for agent, replies in ((agents_for_tests.raises_after_a_call, 1), (lambda task, url: None, 0)):
        collector = AgentTurnCollector(run, agent, 30.0, ["arithmetic_plain"], 1, TURNS, seed=1)
        try:
            records = collector.records(engine, tokenizer, SAMPLING, 0, {})
        finally:
            collector.close()
        assert [len(r["segment_starts"]) for r in records] == [replies] * TURNS
        assert [r["reply_steps"] for r in records] == ([[0], [1]] if replies else [[], []])
        assert [r["termination"] for r in records] == ["agent_error" if replies else "done"] * 2


@pytest.fixture(scope="module")
def models(tiny_model_dir) -> ModelSet:
    torch.manual_seed(5)
    actor = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    return ModelSet(actor, copy.deepcopy(actor),
                    random_head_critic(tiny_model_dir, 0.5).eval())


def _steps(records: list[dict]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for record in records:
        out.setdefault(record["env_index"], []).extend(record["reply_steps"])
    return {slot: sorted(steps) for slot, steps in out.items()}


def test_agent_calls_in_fixed_turns_carry_episodes_across_an_update(tiny_model_dir, models):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = VersionedEngine(HFEngine(tiny_model_dir, dtype="float32"))
    run = ConversationRun.from_params(_params(), progress=False)
    collector = AgentTurnCollector(run, three_calls, 4.0, ["arithmetic_plain"], N_ENVS, TURNS,
                                   seed=1, run_id="t")
    try:
        first = collector.records(engine, tokenizer, SAMPLING, 0, {"run_id": "t"})
        time.sleep(4.5)  # "the update": longer than agent_timeout_s, but held time is not counted
        engine.load_weights({k: v + 0.01 for k, v in engine.inner.model.state_dict().items()})
        second = collector.records(engine, tokenizer, SAMPLING, 1, {"run_id": "t"})
        futures = [slot.future for slot in collector.slots]
    finally:
        collector.close()
    assert not wait(futures, timeout=10).not_done  # the held agents were let go by close()
    for records in (first, second):  # exactly n_envs × turns_per_env calls, steps 0..T-1 a slot
        assert _steps(records) == {slot: list(range(TURNS)) for slot in range(N_ENVS)}
    version = {tuple(p): v for p, v in engine.answered}
    for cut in first:  # each slot's first episode goes on: cut, its held call the bootstrap
        assert cut["cut"] and cut["termination"] is None and cut["reply_steps"] == [0, 1]
        assert all(version[tuple(p)] == 0 for p in cut["window_prompts"])
        (resumed,) = [r for r in second if r["episode_id"] == cut["episode_id"]]
        assert resumed["window_prompts"][0] == cut["bootstrap_prompt_ids"]
        assert version[tuple(resumed["window_prompts"][0])] == 1  # answered after the push
        assert resumed["reply_steps"] == [0] and resumed["first_turn"] == 2
        assert resumed["termination"] == "done" and not resumed["aborted"]
        assert resumed["segment_rewards"] == [1.0] and resumed["assistant_turns"] == CALLS
        assert cut["assistant_turns"] is None  # the episode's totals come with its last part
        assert resumed["user_turns"] == CALLS - 1 and cut["user_turns"] is None  # "go on (k)"
        # the slot's next episode started at once and filled the quota: cut after one call
        (fresh,) = [r for r in second if r["env_index"] == cut["env_index"] and r is not resumed]
        assert fresh["reply_steps"] == [1] and fresh["cut"] and fresh["first_turn"] == 0
    for records in (first, second):  # GAE on the samples: every chain ends or bootstraps
        samples = score_samples(samples_from_episodes(records), models, SimpleNamespace(
            temperature=1.0, kl_beta=0.05, kl_estimator="k1", mini_batch_size=4, bf16=False,
            share_prefix=False), GAE, None, tokenizer.pad_token_id)
        ends = [s["replies"][0] for s in samples if s.get("bootstrap_prompt_ids")]
        assert {s["replies"][0]["finish_reason"] for s in samples} <= {"stop", "length"}
        assert all(s["replies"][0]["finish_reason"] for s in samples)  # each its own call's
        assert len(ends) == N_ENVS and all(r["segment_end"] for r in ends)
        assert all(len(s["advantages"]) == len(s["response_ids"]) for s in samples)
