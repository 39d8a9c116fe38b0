"""Action parsing and translation on messy model outputs."""

import pytest

from longturn.envs.actions import EMPTY, NO_ACTION, UNKNOWN, ActionTranslator, normalise
from longturn.envs.babyai import BabyAITextEnv
from longturn.envs.registry import translator_for


@pytest.fixture(scope="module")
def translator() -> ActionTranslator:
    return translator_for(BabyAITextEnv("goto"))


@pytest.mark.parametrize(
    "output, action",
    [
        ("THINK: the ball is ahead.\nACTION: go forward", "go forward"),
        ("ACTION: go forward.", "go forward"),
        ("ACTION: Go Forward!", "go forward"),
        ("action:   TURN_LEFT  ", "turn left"),
        ("Action: turnright", "turn right"),
        ("ACTION: pickup", "pick up"),
        ("ACTION: **toggle**", "toggle"),
        ("ACTION: `drop`", "drop"),
        ("ACTION: \"move forward\"", "go forward"),
        ("ACTION: goforward", "go forward"),
        ("ACTION:\n\n  go forward\nTHINK: more text", "go forward"),
        ("ACTION: ｇｏ ｆｏｒｗａｒｄ", "go forward"),  # full-width unicode, NFKC folds it
        ("ACTION: go\u00a0forward", "go forward"),  # non-breaking space
        ("ACTION: turn-left", "turn left"),
        ("ACTION: pick up the green key.", "pick up"),
        ("ACTION: drop it", "drop"),
        ("ACTION: go forward to the door", "go forward"),
        ("ACTION: grab the ball", "pick up"),
        ("ACTION: go right", "turn right"),  # no sideways step exists: facing right is meant
        ("ACTION: move to the left", "turn left"),
        ("ACTION: go left to the red ball", "turn left"),
    ],
)
def test_valid_outputs(translator, output, action):
    parsed = translator.parse(output)
    assert parsed.valid, parsed
    assert parsed.action == action
    assert parsed.failure is None


def test_two_actions_last_one_counts(translator):
    parsed = translator.parse("ACTION: turn left\nACTION: pick up")
    assert parsed.valid and parsed.action == "pick up" and parsed.n_action_tags == 2


@pytest.mark.parametrize(
    "output, failure, raw",
    [
        ("", EMPTY, ""),
        ("   \n ", EMPTY, ""),
        ("I will go forward now", NO_ACTION, ""),
        ("ACTION:", EMPTY, ""),
        ("ACTION: ...", EMPTY, "..."),
        ("ACTION: fly to the moon", UNKNOWN, "fly to the moon"),
        ("ACTION: go forward and pick up", UNKNOWN, "go forward and pick up"),
        ("THINKING: 7 steps forward", NO_ACTION, ""),
        ("ACTION: turn left and go forward", UNKNOWN, "turn left and go forward"),
        ("ACTION: go backwards", UNKNOWN, "go backwards"),
        ("ACTION: go right and go forward", UNKNOWN, "go right and go forward"),
        ("ACTION: the key", UNKNOWN, "the key"),
    ],
)
def test_invalid_outputs_use_default(translator, output, failure, raw):
    parsed = translator.parse(output)
    assert not parsed.valid
    assert parsed.action == "go forward"
    assert parsed.failure == failure
    assert parsed.raw_action == raw


def test_ten_kilobytes_of_junk(translator):
    junk = "ACTION:" + "\x00\u202e🙂 ACTION ::" * 800 + "zz" * 1000
    parsed = translator.parse(junk)
    assert not parsed.valid and parsed.action == "go forward"
    parsed = translator.parse("x" * 10_000 + "\nACTION: toggle")
    assert parsed.valid and parsed.action == "toggle"


def test_thirty_thousand_word_action_lines(translator):
    # translate tries heads no longer than the longest name: the same answers, none of the
    # quadratic joining of every head (a probe took 3 s here; bench/parse_speed.py times it)
    parsed = translator.parse("THINK: x\nACTION: pick up the " + "key " * 30_000)
    assert parsed.valid and parsed.action == "pick up"
    parsed = translator.parse("ACTION: " + "word " * 30_000)
    assert not parsed.valid and parsed.failure == UNKNOWN


def test_normalise():
    assert normalise("  Pick_Up. ") == "pick up"
    assert normalise("'TOGGLE'!") == "toggle"


def test_bad_tables_are_rejected():
    with pytest.raises(ValueError, match="default action"):
        ActionTranslator(["a"], {}, "b")
    with pytest.raises(ValueError, match="unknown actions"):
        ActionTranslator(["a"], {"x": "y"}, "a")
