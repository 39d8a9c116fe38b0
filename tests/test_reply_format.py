"""One reply format for every reader: the action parser, the KL split of THINK and ACTION tokens,
prompt validation and the audit's turn view split a reply the same way (`ACTION : x` included,
the drift this module ended)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from longturn.algo.ppo import think_action_masks
from longturn.audit.show import split_reply
from longturn.envs.actions import extract_action_text
from longturn.reply_format import parse_reply
from longturn.validation import think_text

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
