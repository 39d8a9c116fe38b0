"""Verlog's fixed-turn batches with the chat protocol (a critic estimator): every iteration gives
each slot exactly `turns_per_env` replies, an episode still running at the end of one continues
in the next and its last reply there bootstraps from exactly what its next reply is given, and
the critic's next values and GAE follow the same rules as an env slot's turns."""

from __future__ import annotations

import pytest

from longturn.errors import SettingError
from longturn.algo.sample_scoring import score_samples
from longturn.rollout.collection import FixedTurnBatches
from longturn.rollout.conversation_player import conversation_fixed_turns
from longturn.rollout.conversation_rollout import conversation_rollout
from longturn.rollout.conversation_setup import ConversationRun
from longturn.tasks.registry import load_task
from settings_from_params import sampling_settings
from test_conversation_rollout import call, settings, tokenizer  # noqa: F401 (fixture)
from test_sample_scoring import GAE, PAD, Settings, boot_value, models  # noqa: F401 (fixture)

N_ENVS, TURNS = 2, 3


class CyclingEngine:
    """A calculator call, then a wrong answer, over and over: with the revision interaction an
    episode runs four replies (call, answer, revised call, answer), longer than one batch."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, 0
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(self, prompt_ids, sampling):
        from longturn.engines.base import Completion

        out = []
        for ids in prompt_ids:
            tool_results = self.tokenizer.decode(ids).count("<tool_response>")
            answered = self.tokenizer.decode(ids).count("wrong, sorry")
            reply = call("6*7") if tool_results <= answered else "The answer is 41. wrong, sorry"
            tokens = self.tokenizer.encode(reply, add_special_tokens=False) + [self.im_end]
            out.append(Completion(tokens, [-0.5] * len(tokens), "stop"))
        self.calls += 1
        return out


def collect(tokenizer, context: str, iterations: int = 2) -> list[list[dict]]:
    """Each iteration's samples from one collector."""
    run = ConversationRun({"arithmetic": load_task("arithmetic")},
                          settings(history_turns=1 if context == "window" else None),
                          conversation_rollout)
    collector = conversation_fixed_turns(run, ["arithmetic"], N_ENVS, TURNS, seed=3)
    engine = CyclingEngine(tokenizer)
    sampling = sampling_settings(max_new_tokens=64, temperature=1.0, seed=0)
    try:
        return [collector.collect(engine, tokenizer, sampling, it, {"run_id": "t"},
                                  progress=False)
                for it in range(iterations)]
    finally:
        collector.close()


def by_episode(samples: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for s in samples:
        out.setdefault(s["episode_id"], []).append(s)
    return out


def test_a_window_batch_has_turns_per_env_replies_a_slot_and_cut_episodes_go_on(tokenizer):
    first, second = collect(tokenizer, "window")
    for batch in (first, second):
        assert all(len(s["replies"]) == 1 for s in batch)  # a sample a reply
        steps = sorted((s["env_index"], s["replies"][0]["step"]) for s in batch)
        assert steps == [(slot, step) for slot in range(N_ENVS) for step in range(TURNS)]
    later = by_episode(second)
    carried = 0
    for episode, samples in by_episode(first).items():
        last = samples[-1]["replies"][0]
        if episode not in later:
            assert last["termination"] is not None and not last["segment_end"]
            continue
        carried += 1  # cut: a segment end, bootstrapped from the next reply's own window
        assert last["segment_end"] and not last["terminated"] and last["termination"] is None
        assert samples[-1]["bootstrap_prompt_ids"] == later[episode][0]["prompt_ids"]
        turns = [s["replies"][0]["turn"] for s in samples + later[episode]]
        assert turns == list(range(len(turns)))
        assert samples[-1]["messages"] is None  # the episode's totals come with its end
    assert carried == N_ENVS  # four-reply episodes in three-turn batches: both carried over


def test_the_whole_episode_as_context_is_not_cut(tokenizer):
    """verl / slime's context is played whole (collection.EpisodeGroups): no fixed-turn cut."""
    with pytest.raises(SettingError, match="need rollout.context window"):
        collect(tokenizer, "episode")


def test_gae_values_a_cut_episode_by_its_bootstrap(tokenizer, models):
    batch = collect(tokenizer, "window", iterations=1)[0]
    scored = score_samples(batch, models, Settings(), GAE, None, PAD)
    cut = [s for s in scored if s["replies"][-1]["segment_end"]]
    assert cut
    for s in cut:
        assert s["replies"][-1]["next_value"] == pytest.approx(
            boot_value(models, s["bootstrap_prompt_ids"]), abs=1e-5)


def test_a_resumed_collector_keeps_its_counters_and_refuses_other_slots(tokenizer):
    """A resumed collector has the counters it saved (the next episodes' seeds and ids), and a
    checkpoint of other slots is refused (tests/test_conversation_resume.py: the running
    episodes go on)."""
    def collector(n_envs: int) -> FixedTurnBatches:
        run = ConversationRun({"arithmetic": load_task("arithmetic")},
                              settings(history_turns=1), conversation_rollout)
        return conversation_fixed_turns(run, ["arithmetic"], n_envs, TURNS, seed=3)

    played = collector(N_ENVS)
    sampling = sampling_settings(max_new_tokens=64, temperature=1.0, seed=0)
    played.collect(CyclingEngine(tokenizer), tokenizer, sampling, 0, {}, progress=False)
    played.close()
    resumed = collector(N_ENVS)
    resumed.load_state(played.state())
    assert resumed.episode_counts == played.episode_counts and sum(played.episode_counts) >= N_ENVS
    with pytest.raises(SettingError, match="resume with the same rollout.n_envs"):
        collector(N_ENVS + 1).load_state(played.state())


def test_an_episode_queued_at_a_batchs_end_is_kept_by_the_checkpoint(tokenizer):
    """Four-reply episodes in three-step batches: the third episode of each slot ends at the last
    lock-step of iteration 3, and its slot's next episode is queued then. A checkpoint keeps the
    queued start, so a resumed run begins that episode with the same seed and id."""
    def collector():
        run = ConversationRun({"arithmetic": load_task("arithmetic")},
                              settings(history_turns=1), conversation_rollout)
        return conversation_fixed_turns(run, ["arithmetic"], N_ENVS, TURNS, seed=3)

    played, resumed = collector(), collector()
    sampling = sampling_settings(max_new_tokens=64, temperature=1.0, seed=0)
    try:
        for it in range(4):
            played.collect(CyclingEngine(tokenizer), tokenizer, sampling, it, {}, progress=False)
        queued = sorted((s for s, _ in played.player.pending.values()), key=lambda s: s.slot)
        assert [s.episode_id for s in queued] == ["train-r0-e0-3", "train-r0-e1-3"]
        resumed.load_state(played.state())
        assert resumed.episode_counts == played.episode_counts == [4, 4]
        samples = resumed.collect(CyclingEngine(tokenizer), tokenizer, sampling, 4, {},
                                  progress=False)
        assert {r["episode_id"] for r in samples} == {s.episode_id for s in queued}
        assert {r["episode_seed"] for r in samples} == {s.seed for s in queued}
    finally:
        played.close()
        resumed.close()
