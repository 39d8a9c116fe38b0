"""A checkpoint of fixed-turn conversation batches keeps the running episodes, with their tools'
and interaction's state (`episode_state`), so a run resumed from it plays exactly what the
uninterrupted run would have, as env slots do: episodes that a preemption caught in the middle
go on instead of starting over. Where a plug-in's state cannot be kept, the resumed run starts
new episodes and says why, once."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from longturn.engines.base import Completion
from longturn.rollout.conversation_player import conversation_fixed_turns
from longturn.rollout.conversation_rollout import conversation_rollout
from longturn.rollout.conversation_setup import ConversationRun
from longturn.tasks.interactions import load_interactions
from longturn.tasks.registry import load_task
from settings_from_params import conversation_settings, sampling_settings
from test_conversation_rollout import settings as tool_settings
from test_fixed_turn_conversations import CyclingEngine

ROOT = Path(__file__).resolve().parents[1]
ACTIONS = ("ACTION: turn left", "ACTION: go forward", "ACTION: turn right", "ACTION: go forward")


@pytest.fixture(scope="module")
def image_tokenizer(smollm2_tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    return tok


class PromptEngine:
    """A reply picked by the prompt alone (a fresh engine after a resume answers the same), with
    a fake vision side of 4 positions per frame."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.vision = SimpleNamespace(placeholder=(tokenizer.convert_tokens_to_ids("<image>"), 4))
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(self, prompt_ids, sampling, images=None):
        out = []
        for ids in prompt_ids:
            text = ACTIONS[sum(ids) % len(ACTIONS)]
            tokens = self.tokenizer.encode(text, add_special_tokens=False) + [self.end]
            out.append(Completion(tokens, [-0.25] * len(tokens), "stop"))
        return out


def frames_batches(workers: bool = False):
    """BabyAI goto with frames through the chat protocol (EnvInteraction), a window of 2 turns:
    3 slots × 5 replies a batch, so episodes run across batches; with `workers`, each env in a
    worker process (a checkpoint pickles it there, as an env slot's)."""
    interaction = load_interactions(ROOT / "configs/env_interactions.yaml")["env"]
    interaction.config["workers"] = workers
    s = conversation_settings(interaction=interaction, history_turns=2, max_assistant_turns=40,
                              max_user_turns=40, max_tokens=4000)
    run = ConversationRun({"babyai_goto_frames": load_task("babyai_goto_frames")}, s,
                          conversation_rollout)
    return conversation_fixed_turns(run, ["babyai_goto_frames"], 3, 5, seed=1)


def calculator_batches():
    """Arithmetic with the calculator and the revision interaction, a window of 1 turn."""
    run = ConversationRun({"arithmetic": load_task("arithmetic")}, tool_settings(history_turns=1),
                          conversation_rollout)
    return conversation_fixed_turns(run, ["arithmetic"], 2, 3, seed=3)


def play(make, engine, tokenizer, iterations, state: bytes | None = None):
    """Each iteration's samples from a new collector (loaded from `state`), and its state."""
    batches = make()
    try:
        if state is not None:
            batches.load_state(state)
        sampling = sampling_settings(max_new_tokens=16, temperature=1.0, seed=0)
        played = [batches.collect(engine, tokenizer, sampling, it, {"run_id": "r"},
                                  progress=False) for it in iterations]
        return played, batches.state()
    finally:
        batches.close()


@pytest.mark.parametrize("case", ["frames", "frames in env workers", "calculator"])
def test_a_resumed_run_goes_on_with_the_episodes_it_was_playing(case, image_tokenizer):
    make = {"frames": frames_batches, "frames in env workers": lambda: frames_batches(True),
            "calculator": calculator_batches}[case]
    engine = (CyclingEngine(image_tokenizer) if case == "calculator"
              else PromptEngine(image_tokenizer))
    whole, _ = play(make, engine, image_tokenizer, range(3))
    first, state = play(make, engine, image_tokenizer, range(1))
    kept = pickle.loads(state)["running"]["episodes"]
    assert (b"WorkerEnv" in kept) == (case == "frames in env workers")
    resumed, _ = play(make, engine, image_tokenizer, range(1, 3), state)
    assert first + resumed == whole
    # the resume fell in the middle of episodes: the second batch continues some of them
    before = {s["episode_id"] for s in whole[0]}
    went_on = [s for s in whole[1] if s["episode_id"] in before]
    assert went_on and all(s["replies"][0]["turn"] > 0 for s in went_on)


def test_a_state_that_cannot_be_kept_starts_new_episodes_and_says_why_once(
        image_tokenizer, monkeypatch, caplog):
    from longturn.tasks.calculator import CalculatorTool

    monkeypatch.setattr(CalculatorTool, "episode_state", lambda self, i: lambda: i)
    engine = CyclingEngine(image_tokenizer)
    with caplog.at_level(logging.WARNING):
        first, state = play(calculator_batches, engine, image_tokenizer, range(2))
    said = [r.message for r in caplog.records if "not kept in checkpoints" in r.message]
    assert len(said) == 1 and "does not pickle" in said[0]
    assert "running" not in pickle.loads(state)
    resumed, _ = play(calculator_batches, engine, image_tokenizer, range(2, 3), state)
    # new episodes in every slot (the counters resumed): none of the running ones goes on
    turns: dict[str, list[int]] = {}
    for s in resumed[0]:
        turns.setdefault(s["episode_id"], []).append(s["replies"][0]["turn"])
    assert all(min(t) == 0 for t in turns.values())
    assert not set(turns) & {s["episode_id"] for s in first[1]}
