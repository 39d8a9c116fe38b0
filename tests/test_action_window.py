"""An env played as a conversation with a history window is given the action protocol's prompts,
byte for byte what an env slot gives for the same steps: the env's instructions and worked
examples, its last N steps as prompt.* shows them (past observations short, a reply or only its
action, an invalid one as the default action), the oldest dropped to fit
prompt.max_prompt_tokens, and the current observation with its frame alone. Both players run
the same fixed-turn batches on the same seeds; every sample's prompt, reply and bootstrap
prompt (and frames) must agree, and so must what the sample says of them (texts, the action
read, the env's reward, the observation answered, an episode cut by env.max_turns), so one
rollout can play both."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from longturn.agent.prompts import ActionPrompt
from longturn.engines.base import Completion
from longturn.engines.row_seeds import prompt_seeds
from longturn.envs.local import LocalEnv
from longturn.envs.registry import EnvSpec
from longturn.params.config import Params
from longturn.rollout.conversation_player import ConversationPlayer, conversation_fixed_turns
from longturn.rollout.conversation_rollout import conversation_rollout
from longturn.rollout.conversation_setup import ConversationRun
from longturn.rollout.env_player import EnvPlayer, env_fixed_turns
from longturn.rollout.episode_jobs import EpisodeJob, play_jobs
from longturn.tasks.env_frames import EnvInteraction, EnvTask
from longturn.vision.frames import from_png
from settings_from_params import agent_settings, conversation_settings, sampling_settings
from test_history_window import WIDTH, image_tokenizer, tokenizer  # noqa: F401 (fixtures)

# what the engine answers, picked by the prompt: a valid reply, one of no action, an unknown
# action, one with its action alone and one too long to keep whole in a tight budget
REPLIES = ["THINK: the goal is ahead.\nACTION: go forward", "I am not sure what to do.",
           "THINK: hmm.\nACTION: jump", "ACTION: turn left",
           "THINK: " + "the room is large and I should look around first " * 4
           + "\nACTION: turn right"]


class ByPrompt:
    """Answers each prompt with a reply its ids pick, so two players given the same prompts get
    the same replies; keeps every prompt and its frames."""

    def __init__(self, tokenizer, image_id: int | None = None):
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.replies = [tokenizer.encode(text, add_special_tokens=False) + [end]
                        for text in REPLIES]
        if image_id is not None:
            self.vision = SimpleNamespace(placeholder=(image_id, WIDTH))

    def generate(self, prompt_ids, sampling, images=None):
        return [Completion(list(ids), [-0.5] * len(ids), "stop") for ids in
                (self.replies[(sum(p) + len(p)) % len(self.replies)] for p in prompt_ids)]


class BySeed(ByPrompt):
    """Answers each prompt with a reply its ids and its sampling seed pick: two players agree
    only if they seed every lock-step, and every prompt in it, alike."""

    def generate(self, prompt_ids, sampling, images=None):
        seeds = prompt_seeds(sampling.seed, len(prompt_ids))
        return [Completion(list(ids), [-0.5] * len(ids), "stop") for ids in
                (self.replies[(sum(p) + len(p) + seed) % len(self.replies)]
                 for p, seed in zip(prompt_ids, seeds))]


def play_both(tokenizer, engine, image: bool, iterations: int = 2, seed: int | None = None,
              turns_per_env: int = 4, **prompt):
    """`iterations` fixed-turn batches (2 slots × `turns_per_env` lock-steps, episodes of at
    most 5 steps) by env slots and by conversations of the same env, sampled from `seed`: each
    one's samples by (episode, turn), in the order handed on; both name the same actions."""
    shown = replace(ActionPrompt.from_config(Params().prompt),
                    **{k: prompt.pop(k) for k in list(prompt) if k != "history_turns"})
    turns = prompt["history_turns"]
    kwargs = {"num_dists": 1, **({"image": True} if image else {})}
    slots = env_fixed_turns(lambda task: LocalEnv(EnvSpec("babyai", task, kwargs).build(),
                                                  EnvSpec("babyai", task, kwargs)),
                            ["goto"], n_envs=2, turns_per_env=turns_per_env, seed=5,
                            run_id="t",
                            settings=agent_settings(history_turns=turns, prompt=shown,
                                                    max_turns=5))
    settings = conversation_settings(history_turns=turns, action_prompt=shown,
                                     interaction=EnvInteraction({"max_turns": 5}, "env"),
                                     max_assistant_turns=50, max_user_turns=50, max_tokens=8000)
    task = EnvTask("babyai", "goto", image=image, kwargs={"num_dists": 1})
    conversations = conversation_fixed_turns(
        ConversationRun({"goto": task}, settings, conversation_rollout), ["goto"], n_envs=2,
        turns_per_env=turns_per_env, seed=5, run_id="t")
    out, names = [], []
    for collector in (slots, conversations):
        samples = [s for i in range(iterations) for s in collector.collect(
            engine, tokenizer, sampling_settings(max_new_tokens=64, seed=seed), i,
            progress=False)]
        names.append(collector.action_names())  # the action mix's, in the env's order
        collector.close()
        out.append({(s["episode_id"], s["replies"][0]["turn"]): s for s in samples})
    assert names[0] == names[1] and "go forward" in names[0]
    return out


def assert_same_samples(by_slots, by_conversations):
    assert list(by_slots) == list(by_conversations)  # and in the same order (the mini-batches)
    for key, a in by_slots.items():
        b = by_conversations[key]
        (ra,), (rb,) = a["replies"], b["replies"]
        for column in ("prompt_ids", "prompt_text", "response_ids", "env_index", "env_name",
                       "task", "episode_seed"):
            assert a[column] == b[column], (key, column)
        for column in ("step", "response_text", "action", "raw_action", "action_valid",
                       "action_failure", "env_reward", "reward", "terminated", "truncated",
                       "segment_end", "history_dropped", "observation", "termination"):
            assert ra[column] == rb[column], (key, column)
        assert a["bootstrap_prompt_ids"] == b["bootstrap_prompt_ids"], key
        for prefix in ("", "bootstrap_"):
            # no frame: None in an env slot's sample, [] in a window's
            assert (a[f"{prefix}image_starts"] or []) == (b[f"{prefix}image_starts"] or []), key
            for x, y in zip(a[f"{prefix}images"] or [], b[f"{prefix}images"] or [], strict=True):
                np.testing.assert_array_equal(from_png(x), from_png(y))


@pytest.mark.parametrize("prompt", [
    {"history_turns": 1},  # the default: one past step, the reply in full, invalid as default
    {"history_turns": 3, "history_content": "action", "demonstration": False},
    {"history_turns": 2, "invalid_in_history": "raw_output"},
], ids=["default", "actions-only", "raw-invalid"])
def test_conversations_of_an_env_are_given_an_env_slots_prompts(tokenizer, prompt):
    by_slots, by_conversations = play_both(tokenizer, ByPrompt(tokenizer), False, **prompt)
    replies = [s["replies"][0] for s in by_slots.values()]
    assert len(replies) == 16  # 2 slots × 4 lock-steps × 2 iterations
    assert {r["action_failure"] for r in replies} >= {None, "no_action", "unknown_action"}
    assert any(r["truncated"] for r in replies)  # an episode hit env.max_turns: bootstrapped
    assert any(r["segment_end"] and not r["truncated"] for r in replies)  # a batch cut one
    assert_same_samples(by_slots, by_conversations)


def test_the_oldest_steps_are_dropped_alike_to_fit_the_prompt_budget(tokenizer):
    by_slots, by_conversations = play_both(tokenizer, ByPrompt(tokenizer), False,
                                           history_turns=4, max_prompt_tokens=700)
    longest = max(len(s["prompt_ids"]) for s in by_slots.values())
    assert longest <= 700
    assert {s["replies"][0]["history_dropped"] for s in by_slots.values()} > {0}
    assert_same_samples(by_slots, by_conversations)


def test_with_frames_each_prompt_shows_its_current_observations_frame_alone(image_tokenizer):
    image_id = image_tokenizer.convert_tokens_to_ids("<image>")
    by_slots, by_conversations = play_both(image_tokenizer,
                                           ByPrompt(image_tokenizer, image_id), True,
                                           history_turns=2)
    for sample in by_conversations.values():
        assert len(sample["images"]) == 1 and sample["prompt_ids"].count(image_id) == WIDTH
    assert any(s["bootstrap_images"] for s in by_conversations.values())
    assert_same_samples(by_slots, by_conversations)


def test_both_players_seed_each_lock_step_alike(tokenizer):
    """A seeded collection samples lock-step `step` of iteration `i` from one seed, whichever
    player plays the env (`lock_step_seed`), and each prompt of the call from its row of it."""
    by_slots, by_conversations = play_both(tokenizer, BySeed(tokenizer), False, seed=11,
                                           history_turns=1)
    assert_same_samples(by_slots, by_conversations)
    # the seed is what picked the replies: another one gives other replies
    other, _ = play_both(tokenizer, BySeed(tokenizer), False, seed=12, history_turns=1)
    assert [s["response_ids"] for s in other.values()] != [
        s["response_ids"] for s in by_slots.values()]


def test_an_evaluation_plays_each_episode_alike_from_its_own_seeds(tokenizer):
    """An evaluation's jobs played to their end in 2 slots (`play_jobs`), one already in the
    journal: each reply samples from its episode's id and turn (`episode_turn_seed`), so env
    slots and conversations of the env give the same episodes, whatever shares a lock-step."""
    shown = ActionPrompt.from_config(Params().prompt)
    spec = EnvSpec("babyai", "goto", {"num_dists": 1})
    jobs = [EpisodeJob("goto", seed, f"eval-goto-{seed}") for seed in (3, 4, 5, 6, 7)]
    finished = {"eval-goto-4": 2}  # in the journal: its slot is held for its 2 replies
    run = ConversationRun({"goto": EnvTask("babyai", "goto", image=False,
                                           kwargs={"num_dists": 1})},
                          conversation_settings(history_turns=1, action_prompt=shown,
                                                interaction=EnvInteraction({"max_turns": 5},
                                                                           "env"),
                                                max_assistant_turns=50, max_user_turns=50,
                                                max_tokens=8000),
                          conversation_rollout)
    players = [EnvPlayer(lambda task: LocalEnv(spec.build(), spec), ["goto", "goto"],
                         agent_settings(history_turns=1, prompt=shown, max_turns=5),
                         whole_episodes=True, keyed_seeds=True),
               ConversationPlayer(run, 2, fixed_turns=False, keyed_seeds=True)]
    played = []
    for player in players:
        episodes: list = []
        try:
            play_jobs(player, BySeed(tokenizer), tokenizer,
                      sampling_settings(max_new_tokens=64, seed=21), jobs, finished,
                      episodes.append, lambda slot, job, why: None, progress=False)
        finally:
            player.close()
        played.append(episodes)
    by_slots, by_conversations = played
    assert [[s["episode_id"] for s in ep] for ep in by_slots] == [
        [s["episode_id"] for s in ep] for ep in by_conversations]  # in the order they ended
    assert {ep[0]["episode_id"] for ep in by_slots} == {j.episode_id for j in jobs} - {
        "eval-goto-4"}
    for a, b in zip(by_slots, by_conversations):
        for x, y in zip(a, b, strict=True):
            (rx,), (ry,) = x["replies"], y["replies"]
            assert (x["prompt_ids"], x["response_ids"], x["env_index"]) == (
                y["prompt_ids"], y["response_ids"], y["env_index"])
            for column in ("step", "turn", "action", "reward", "terminated", "truncated",
                           "segment_end", "termination"):
                assert rx[column] == ry[column], (x["episode_id"], column)
    # the seeds decided the replies: the replies differ across episodes at one turn
    assert len({tuple(ep[0]["response_ids"]) for ep in by_slots}) > 1


def test_an_episode_that_ends_at_the_batch_s_last_lock_step_ends_its_segment_there(tokenizer):
    """Batches of 5 lock-steps, episodes cut at 5 steps by env.max_turns: an episode begun with
    the batch ends at its last lock-step, and that reply's segment ends there in both players
    (an env slot marks every reply of the last lock-step)."""
    by_slots, by_conversations = play_both(tokenizer, BySeed(tokenizer), False, iterations=1,
                                           seed=11, turns_per_env=5, history_turns=1)
    replies = [s["replies"][0] for s in by_slots.values()]
    assert any(r["segment_end"] and (r["terminated"] or r["truncated"]) for r in replies)
    assert_same_samples(by_slots, by_conversations)


CLOSED: list = []  # the envs closed (a checkpoint pickles them: counted here, not on them)


class ClosingCounted(LocalEnv):
    def close(self):
        CLOSED.append(self)
        super().close()


def test_a_checkpoint_of_env_slots_resumes_with_new_episodes_in_conversations(tokenizer, caplog):
    """A run checkpointed while env slots played it resumes with the env played as
    conversations: the slots' envs are closed, their running episodes end, and the slots start
    their next episodes (the episode counters go on), said once in the log."""
    spec = EnvSpec("babyai", "goto", {"num_dists": 1})
    CLOSED.clear()
    slots = env_fixed_turns(lambda task: ClosingCounted(spec.build(), spec), ["goto"], n_envs=2,
                            turns_per_env=2, seed=5, run_id="t",
                            settings=agent_settings(history_turns=1, max_turns=5))
    engine = ByPrompt(tokenizer)
    first = slots.collect(engine, tokenizer, sampling_settings(max_new_tokens=64), 0,
                          progress=False)
    blob = slots.state()
    assert {s["episode_id"] for s in first} == {"t-r0-e0-0", "t-r0-e1-0"}  # still running
    settings = conversation_settings(history_turns=1,
                                     action_prompt=ActionPrompt.from_config(Params().prompt),
                                     interaction=EnvInteraction({"max_turns": 5}, "env"),
                                     max_assistant_turns=50, max_user_turns=50, max_tokens=8000)
    resumed = conversation_fixed_turns(
        ConversationRun({"goto": EnvTask("babyai", "goto", image=False,
                                         kwargs={"num_dists": 1})}, settings,
                        conversation_rollout), ["goto"], n_envs=2, turns_per_env=2, seed=5,
        run_id="t")
    with caplog.at_level("WARNING"):
        resumed.load_state(blob)
    assert len(CLOSED) == 2 and "2 env slots' running episodes" in caplog.text
    samples = resumed.collect(engine, tokenizer, sampling_settings(max_new_tokens=64), 1,
                              progress=False)
    resumed.close()
    assert {s["episode_id"] for s in samples} == {"t-r0-e0-1", "t-r0-e1-1"}
