"""Messy model outputs -> Crafter actions through the generic translator and crafter/synonyms.yaml.

Verlog's parsing vectors (SPEC_crafter_text.md §5.2) where the generic rules agree, and the
documented places where they do not.
"""

from __future__ import annotations

import pytest

from longturn.envs.actions import ActionTranslator
from longturn.envs.synonyms import load_synonyms
from longturn.envs.crafter.vocabulary import ACTIONS


@pytest.fixture(scope="module")
def translator() -> ActionTranslator:
    return ActionTranslator(list(ACTIONS), load_synonyms("longturn.envs.crafter"), "Noop")


@pytest.mark.parametrize("output, action", [
    # Verlog's test vectors
    ("THINK: trees are west.\nACTION: Move West.", "Move West"),
    ("ACTION: collect wood", "Do"),
    ("ACTION: do (chop tree)", "Do"),
    ("ACTION: Move North 2 Steps", "Move North"),
    ("ACTION: Make Table", "Place Table"),
    ("ACTION: MOVE EAST", "Move East"),
    ("ACTION: make wood pickaxe\nthen craft a sword", "Make Wood Pickaxe"),
    # the rest of Verlog's table
    ("ACTION: Chop_Tree", "Do"),
    ("ACTION: Drink From Lakes,", "Do"),
    ("ACTION: defeat zombie", "Do"),
    ("ACTION: make crafting table.", "Place Table"),
    ("ACTION: Make Furnace", "Place Furnace"),
    ("ACTION: move south 1 step", "Move South"),
    ("ACTION: Move West 3 Steps", "Move West"),
    # case, spacing and markdown are forgiven
    ("THINK: nothing to do.\nACTION: noop", "Noop"),
    ("action:   **Sleep**", "Sleep"),
    ("ACTION: `place stone`", "Place Stone"),
    ("ACTION: make_iron_sword", "Make Iron Sword"),
    ("ACTION: attack the zombie", "Do"),
    ("ACTION: move left", "Move West"),
    ("ACTION: craft stone pickaxe", "Make Stone Pickaxe"),
    ("ACTION: Move West\nACTION: Do", "Do"),  # the last tag counts
])
def test_valid_outputs(translator: ActionTranslator, output: str, action: str) -> None:
    parsed = translator.parse(output)
    assert parsed.valid and parsed.action == action, parsed


@pytest.mark.parametrize("output", [
    "ACTION: Drink water",  # invalid in Verlog too
    "ACTION: jump",
    "ACTION:",
    "ACTION: move north-west",  # Verlog: a random one of the two moves (see below)
    "ACTION: do (dance)",  # Verlog strips any parenthesis after Do; the table lists common ones
    "Move West",  # no tag: Verlog accepts it, the generic parser needs ACTION:
])
def test_invalid_outputs_run_noop(translator: ActionTranslator, output: str) -> None:
    parsed = translator.parse(output)
    assert not parsed.valid and parsed.action == "Noop", parsed


def test_generic_parser_is_more_lenient_than_verlog(translator: ActionTranslator) -> None:
    # Verlog rejects these (underscores; `Action: Noop` leaves `: Noop`); the generic parser
    # accepts them
    assert translator.parse("ACTION: place_table").action == "Place Table"
    assert translator.parse("Action: Noop").valid


def test_synonyms_point_to_actions() -> None:
    synonyms = load_synonyms("longturn.envs.crafter")
    assert set(synonyms.values()) <= set(ACTIONS)
    assert len(synonyms) >= 60 and synonyms["make table"] == "Place Table"
