"""One reply format for every reader: the action parser, the KL split of THINK and ACTION tokens,
prompt validation and the audit's turn view split a reply the same way (`ACTION : x` included,
the drift this module ended)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from longturn.algo.ppo import think_action_masks
from longturn.audit.show import split_reply
from longturn.envs.actions import extract_action_text
from longturn.reply_format import Reply, parse_reply
from longturn.run.validation import think_text

REPLIES = [
    ("THINK: the key is ahead. ACTION: go forward", "the key is ahead.", "go forward", 1),
    ("think: left first\nACTION : turn left", "left first", "turn left", 1),
    ("THINK: hm ACTION: pick up\nACTION:  drop", "hm ACTION: pick up", "drop", 2),
    ("no tags at all", "no tags at all", None, 0),
    ("Action: toggle", "", "toggle", 1),
]


@pytest.mark.parametrize("text, think, action, tags", REPLIES)
def test_every_reader_splits_alike(text, think, action, tags) -> None:
    reply = parse_reply(text)
    assert (reply.think, reply.n_action_tags) == (think, tags)
    assert extract_action_text(text) == (action, tags)
    assert split_reply(text) == (think, action or "")
    assert think_text(text) == (think if reply.has_think else "")


def test_kl_split_starts_at_the_tag_the_parser_reads(smollm2_tokenizer_dir) -> None:
    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    for text, *_ in REPLIES:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        think, action = think_action_masks([ids], tokenizer)
        first_action = int(action[0].int().argmax()) if action.any() else len(ids)
        covered = tokenizer.decode(ids[: first_action + 1]) if action.any() else text
        assert think[0].sum() + action[0].sum() == len(ids)
        if parse_reply(text).n_action_tags:  # the tag's first character is in the first ACTION token
            assert len(covered) > parse_reply(text).action_start
            assert len(tokenizer.decode(ids[:first_action])) <= parse_reply(text).action_start
        else:
            assert not action.any()


# ---- the split is the regex split, in linear time -------------------------------------------

THINK_TAG = re.compile(r"think\s*:", re.IGNORECASE)
ACTION_TAG = re.compile(r"action\s*:", re.IGNORECASE)


def regex_split(text: str) -> Reply:
    """The reference: the two regexes the parser used to be (the contract, written as a search)."""
    tags = list(ACTION_TAG.finditer(text))
    start = tags[-1].start() if tags else len(text)
    think = THINK_TAG.search(text, 0, start)
    head = text[think.end():start] if think else text[:start]
    return Reply(head.strip(), think is not None, text[tags[-1].end():] if tags else None, start,
                 len(tags))


# tag-like pieces: the words in every case re's IGNORECASE folds (dotted and dotless i, the
# Kelvin sign) and halves of them, then runs of what `\s` matches (Unicode spaces included) or
# almost matches (a zero-width space is not a space), then a colon or not
WORDS = st.sampled_from(["think", "THINK", "ThInK", "thİnk", "thınk", "thin\u212a", "action",
                         "ACTION", "actİon", "act", "ion", "thi", "nk", "x"])
SPACES = st.text(st.sampled_from(" \n\t\r\x0b\x1c\u3000\u2028\u00a0\u200b"), max_size=3)
TAG_PIECES = st.tuples(WORDS, SPACES, st.sampled_from([":", "", "::"])).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.lists(TAG_PIECES | st.text(max_size=3)).map("".join)))
def test_the_split_is_the_regex_split(text) -> None:
    assert parse_reply(text) == regex_split(text)
    extract_action_text(text)  # and no reader raises on it
    think_text(text)


@pytest.mark.parametrize("text", [
    "word " * 30_000,
    "THINK: x ACTION: " + "word " * 30_000,
    "ACTION: x " * 10_000,
    "action" + " " * 100_000,
    "think " * 20_000 + "ACTION:" + "think:" * 10_000,
    "Action :" * 12_000 + "THINK:" + " " * 50_000,
])
def test_long_adversarial_replies_split_as_the_regex_splits(text) -> None:
    assert parse_reply(text) == regex_split(text)
