"""An env played as a conversation of its interaction (the action protocol's rollout) gives each
reply the action protocol's prompt, byte for byte what the prompt of the env's own steps is: the
env's instructions and worked examples, its last N steps as prompt.* shows them (past
observations short, a reply or only its action, an invalid one as the default action), the
oldest dropped to fit prompt.max_prompt_tokens, and the current observation with its frame
alone. Each fixed-turn batch is checked against an independent replay: the env reset from each
episode's seed and stepped with the actions its samples say, every prompt (and bootstrap
prompt, frames included) rendered from that replay, every reward and ending read from it, and
every reply the one its seed (lock-step's or episode's) picks."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, replace
from types import SimpleNamespace

import numpy as np
import pytest

from longturn.agent.memory import PastTurn
from longturn.agent.prompts import ActionPrompt, ActionView
from longturn.engines.base import Completion, engine_image_token
from longturn.engines.row_seeds import episode_turn_seed, lock_step_seed, prompt_seeds
from longturn.envs.registry import EnvSpec, translator_for
from longturn.params.config import Params, parse_params
from longturn.rollout.conversation_player import ConversationPlayer, conversation_fixed_turns
from longturn.rollout.conversation_setup import ConversationRun
from longturn.rollout.episode_jobs import EpisodeJob, play_jobs
from longturn.vision.frames import from_png
from settings_from_params import sampling_settings
from test_history_window import WIDTH, image_tokenizer, tokenizer  # noqa: F401 (fixtures)

# what the engine answers, picked by the prompt: a valid reply, one of no action, an unknown
# action, one with its action alone, one too long to keep whole in a tight budget, and one with
# a special token inside (read without it, as the text of the reply)
REPLIES = ["THINK: the goal is ahead.\nACTION: go forward", "I am not sure what to do.",
           "THINK: hmm.\nACTION: jump", "ACTION: turn left",
           "THINK: " + "the room is large and I should look around first " * 4
           + "\nACTION: turn right",
           "THINK: a wall<|im_start|> on the left.\nACTION: turn right"]
KWARGS = {"num_dists": 1}
MAX_TURNS = 5


class ByPrompt:
    """Answers each prompt with a reply its ids pick; keeps every prompt and its frames."""

    def __init__(self, tokenizer, image_id: int | None = None):
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.replies = [tokenizer.encode(text, add_special_tokens=False) + [end]
                        for text in REPLIES]
        if image_id is not None:
            self.vision = SimpleNamespace(placeholder=(image_id, WIDTH))

    def pick(self, prompt_ids, seed: int = 0) -> list[int]:
        return self.replies[(sum(prompt_ids) + len(prompt_ids) + seed) % len(self.replies)]

    def generate(self, prompt_ids, sampling, images=None):
        return [Completion(list(self.pick(p)), [-0.5] * len(self.pick(p)), "stop")
                for p in prompt_ids]


class BySeed(ByPrompt):
    """Answers each prompt with a reply its ids and its sampling seed pick (`pick`)."""

    def generate(self, prompt_ids, sampling, images=None):
        seeds = prompt_seeds(sampling.seed, len(prompt_ids))
        return [Completion(list(self.pick(p, seed)), [-0.5] * len(self.pick(p, seed)), "stop")
                for p, seed in zip(prompt_ids, seeds)]


def env_run(shown: ActionPrompt, turns: int, image: bool) -> ConversationRun:
    """goto of BabyAI as the action protocol's conversations of it (`ConversationRun.of_env`),
    shown as `shown` says with `turns` past steps, episodes cut at MAX_TURNS steps."""
    params = parse_params({
        "env": {"tasks": ["goto"], "max_turns": MAX_TURNS, "workers": False,
                "step_timeout_s": None, "kwargs": {**KWARGS, **({"image": True} if image else {})}},
        "prompt": {**asdict(shown), "history_turns": turns}})
    return ConversationRun.of_env(params, progress=False)


def play(tokenizer, engine, image: bool, iterations: int = 2, seed: int | None = None,
         turns_per_env: int = 4, **prompt):
    """`iterations` fixed-turn batches (2 slots × `turns_per_env` lock-steps) of conversations
    of the env, sampled from `seed`: their samples in the order handed on, and the prompt
    settings they were shown."""
    shown = replace(ActionPrompt.from_config(Params().prompt),
                    **{k: prompt.pop(k) for k in list(prompt) if k != "history_turns"})
    collector = conversation_fixed_turns(env_run(shown, prompt["history_turns"], image),
                                         ["goto"], n_envs=2, turns_per_env=turns_per_env,
                                         seed=5, run_id="t")
    try:
        samples = [s for i in range(iterations) for s in collector.collect(
            engine, tokenizer, sampling_settings(max_new_tokens=64, seed=seed), i,
            progress=False)]
        assert "go forward" in collector.action_names()  # the action mix's, the env's own
    finally:
        collector.close()
    return samples, shown


def replay(samples, tokenizer, shown: ActionPrompt, turns: int, image: bool, engine):
    """The independent reference: each episode's env reset from its seed and stepped with the
    actions its samples say (each the action its reply's text names); per (episode, turn) the
    prompt of that step's view and of the view after it (a bootstrap's), the env's reward and
    whether the step ended the episode."""
    image_token = engine_image_token(engine)
    kwargs = {**KWARGS, **({"image": True} if image else {})}
    episodes = defaultdict(list)
    for sample in samples:
        episodes[sample["episode_id"]].append(sample)
    out = {}
    for episode, replies in episodes.items():
        replies.sort(key=lambda s: s["replies"][0]["turn"])
        env = EnvSpec("babyai", replies[0]["task"], kwargs).build()
        obs, _ = env.reset(seed=replies[0]["episode_seed"])
        past: list[PastTurn] = []

        def prompt():
            view = ActionView(env.instructions, list(past), obs.text, obs.image)
            return shown.render(tokenizer, view, turns, image_token), obs

        parse = translator_for(env).parse
        for sample in replies:
            (reply,) = sample["replies"]
            read = parse(reply["response_text"])  # the action the reply names, or the default
            assert (reply["action"], reply["action_valid"]) == (read.action, read.valid)
            given, seen = prompt()
            past.append(PastTurn(seen.text, reply["response_text"], reply["action"],
                                 reply["action_valid"]))
            obs, reward, terminated, truncated, _ = env.step(reply["action"])
            truncated = (truncated or len(past) >= MAX_TURNS) and not terminated
            out[(episode, reply["turn"])] = SimpleNamespace(
                given=given, seen=seen, following=prompt()[0], env_reward=reward,
                terminated=terminated, truncated=truncated)
        env.close()
    return out


def assert_as_replayed(samples, tokenizer, shown, turns, image, engine, turns_per_env=4):
    """Every sample against the replay: its prompt and frame, what it says of the step (the
    reply's text without special tokens, the action read, the reward, the ending), and its
    bootstrap prompt where the batch cut its episode or a time limit did."""
    expected = replay(samples, tokenizer, shown, turns, image, engine)
    assert len(expected) == len(samples)
    for sample in samples:
        (reply,) = sample["replies"]
        want = expected[(sample["episode_id"], reply["turn"])]
        assert sample["prompt_ids"] == want.given.ids and sample["prompt_text"] == want.given.text
        assert reply["history_dropped"] == want.given.history_dropped
        assert reply["observation"] == want.seen.text
        assert reply["response_text"] == tokenizer.decode(sample["response_ids"],
                                                          skip_special_tokens=True)
        assert reply["env_reward"] == want.env_reward
        assert reply["reward"] == pytest.approx(want.env_reward - 0.1 * (not reply["action_valid"]))
        assert (reply["terminated"], reply["truncated"]) == (want.terminated, want.truncated)
        assert reply["segment_end"] == (reply["step"] == turns_per_env - 1)  # the batch's end
        bootstrapped = reply["truncated"] or (reply["step"] == turns_per_env - 1
                                              and not reply["terminated"])
        assert (sample["bootstrap_prompt_ids"] is not None) == bootstrapped
        if bootstrapped:
            assert sample["bootstrap_prompt_ids"] == want.following.ids
        for prefix, prompt in (("", want.given), ("bootstrap_", want.following)):
            if prefix and not bootstrapped:
                continue
            assert (sample[f"{prefix}image_starts"] or []) == prompt.image_starts
            for png, frame in zip(sample[f"{prefix}images"] or [], prompt.frames, strict=True):
                np.testing.assert_array_equal(from_png(png), frame)
    # in the order an update's mini-batches take them: by lock-step, then slot
    order = [(s["iteration"], s["replies"][0]["step"], s["env_index"]) for s in samples]
    assert order == sorted(order)


@pytest.mark.parametrize("prompt", [
    {"history_turns": 1},  # the default: one past step, the reply in full, invalid as default
    {"history_turns": 3, "history_content": "action", "demonstration": False},
    {"history_turns": 2, "invalid_in_history": "raw_output"},
], ids=["default", "actions-only", "raw-invalid"])
def test_conversations_of_an_env_are_given_its_steps_action_prompts(tokenizer, prompt):
    turns = prompt["history_turns"]
    engine = ByPrompt(tokenizer)
    samples, shown = play(tokenizer, engine, False, **prompt)
    replies = [s["replies"][0] for s in samples]
    assert len(replies) == 16  # 2 slots × 4 lock-steps × 2 iterations
    assert {r["action_failure"] for r in replies} >= {None, "no_action", "unknown_action"}
    assert any(r["truncated"] for r in replies)  # an episode hit env.max_turns: bootstrapped
    assert any(r["segment_end"] and not r["truncated"] for r in replies)  # a batch cut one
    assert any("<|im_start|>" in tokenizer.decode(s["response_ids"]) for s in samples)
    assert_as_replayed(samples, tokenizer, shown, turns, False, engine)


def test_the_oldest_steps_are_dropped_to_fit_the_prompt_budget(tokenizer):
    engine = ByPrompt(tokenizer)
    samples, shown = play(tokenizer, engine, False, history_turns=4, max_prompt_tokens=700)
    assert max(len(s["prompt_ids"]) for s in samples) <= 700
    assert {s["replies"][0]["history_dropped"] for s in samples} > {0}
    assert_as_replayed(samples, tokenizer, shown, 4, False, engine)


def test_with_frames_each_prompt_shows_its_current_observations_frame_alone(image_tokenizer):
    image_id = image_tokenizer.convert_tokens_to_ids("<image>")
    engine = ByPrompt(image_tokenizer, image_id)
    samples, shown = play(image_tokenizer, engine, True, history_turns=2)
    for sample in samples:
        assert len(sample["images"]) == 1 and sample["prompt_ids"].count(image_id) == WIDTH
    assert any(s["bootstrap_images"] for s in samples)
    assert_as_replayed(samples, image_tokenizer, shown, 2, True, engine)


def test_each_lock_step_samples_from_its_own_seed(tokenizer):
    """A seeded collection samples lock-step `step` of iteration `i` from `lock_step_seed`, each
    running episode's prompt (in slot order) from its row of it."""
    engine = BySeed(tokenizer)
    samples, shown = play(tokenizer, engine, False, seed=11, history_turns=1)
    by_lock_step = defaultdict(list)
    for sample in samples:
        by_lock_step[(sample["iteration"], sample["replies"][0]["step"])].append(sample)
    for (iteration, step), batch in by_lock_step.items():
        batch.sort(key=lambda s: s["env_index"])
        seeds = prompt_seeds(lock_step_seed(11, iteration, step), len(batch))
        for sample, seed in zip(batch, seeds):
            assert sample["response_ids"] == engine.pick(sample["prompt_ids"], seed)
    assert_as_replayed(samples, tokenizer, shown, 1, False, engine)
    other, _ = play(tokenizer, engine, False, seed=12, history_turns=1)
    assert [s["response_ids"] for s in other] != [s["response_ids"] for s in samples]


def test_an_evaluation_plays_each_episode_from_its_own_seeds(tokenizer):
    """An evaluation's jobs played to their end in 2 slots (`play_jobs`), one already in the
    journal (its slot held for its replies): each reply samples from its episode's id and turn
    (`episode_turn_seed`), whatever shares its lock-step."""
    shown = ActionPrompt.from_config(Params().prompt)
    jobs = [EpisodeJob("goto", seed, f"eval-goto-{seed}") for seed in (3, 4, 5, 6, 7)]
    finished = {"eval-goto-4": 2}  # in the journal: its slot is held for its 2 replies
    engine = BySeed(tokenizer)
    player = ConversationPlayer(env_run(shown, 1, False), 2, fixed_turns=False, keyed_seeds=True)
    episodes: list = []
    try:
        play_jobs(player, engine, tokenizer, sampling_settings(max_new_tokens=64, seed=21), jobs,
                  finished, episodes.append, lambda slot, job, why: None, progress=False)
    finally:
        player.close()
    assert {ep[0]["episode_id"] for ep in episodes} == {j.episode_id for j in jobs} - {
        "eval-goto-4"}
    slot_free = {0: 0, 1: 2}  # lock-step each slot is free from: slot 1 held by eval-goto-4
    for episode in episodes:
        first = episode[0]["replies"][0]
        assert first["step"] >= slot_free[episode[0]["env_index"]]
        slot_free[episode[0]["env_index"]] = episode[-1]["replies"][0]["step"] + 1
        for sample in episode:
            (reply,) = sample["replies"]
            seed = episode_turn_seed(21, sample["episode_id"], reply["turn"])
            assert sample["response_ids"] == engine.pick(sample["prompt_ids"], seed)
            assert reply["segment_end"] is None  # an evaluation has no segments
    samples = [s for episode in episodes for s in episode]
    expected = replay(samples, tokenizer, shown, 1, False, engine)
    for sample in samples:
        (reply,) = sample["replies"]
        want = expected[(sample["episode_id"], reply["turn"])]
        assert sample["prompt_ids"] == want.given.ids
        assert (reply["terminated"], reply["truncated"]) == (want.terminated, want.truncated)
        assert sample["bootstrap_prompt_ids"] is None  # played whole: nothing bootstrapped
    assert len({tuple(ep[0]["response_ids"]) for ep in episodes}) > 1  # the seeds decided


def test_an_episode_that_ends_at_the_batch_s_last_lock_step_ends_its_segment_there(tokenizer):
    """Batches of 5 lock-steps, episodes cut at 5 steps by env.max_turns: an episode begun with
    the batch ends at its last lock-step, and that reply's segment ends there."""
    engine = BySeed(tokenizer)
    samples, shown = play(tokenizer, engine, False, iterations=1, seed=11, turns_per_env=5,
                          history_turns=1)
    replies = [s["replies"][0] for s in samples]
    assert any(r["segment_end"] and (r["terminated"] or r["truncated"]) for r in replies)
    for r in replies:
        assert r["segment_end"] == (r["step"] == 4)
    assert_as_replayed(samples, tokenizer, shown, 1, False, engine, turns_per_env=5)
