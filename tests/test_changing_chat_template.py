"""A chat template that renders differently on each call (Llama 3.1 writes "Today Date: …", which
changes at midnight): with the check off nothing re-renders it for checking; with the check on
the error says the template is not deterministic and quotes where two renders differ."""

from __future__ import annotations

import itertools
import re
from datetime import datetime, timedelta

import pytest
from transformers import AutoTokenizer
from transformers.utils import chat_template_utils

from longturn.rollout.chat_deltas import ChatTemplateError
from longturn.tasks.arithmetic import make_problem
from test_conversation_rollout import run

# ChatML with a dated system header, as Llama 3.1's template writes one
DATED = ("{{- '<|im_start|>system\\nToday Date: ' + strftime_now('%d %b %Y') + '<|im_end|>\\n' -}}"
         "{%- for m in messages -%}"
         "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}{%- endfor -%}"
         "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")


@pytest.fixture
def dated(smollm2_tokenizer_dir, monkeypatch):
    """The SmolLM2 tokenizer with the dated template, whose date moves on one day per render."""
    days = itertools.count()

    class NextDay:
        @staticmethod
        def now() -> datetime:
            return datetime(2024, 7, 1) + timedelta(days=next(days))

    # the template's strftime_now reads this module's `datetime`
    monkeypatch.setattr(chat_template_utils, "datetime", NextDay)
    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    tok.chat_template = DATED
    return tok


def test_check_off_plays_a_changing_template_without_error(dated):
    [rec] = run(dated, {2: ["ANSWER: -1", "ANSWER: -2"]}, tokenization_check="off")
    assert (rec["termination"], rec["user_turns"], rec["tokenization_check"]) == (
        "done", 1, "skipped")
    text = dated.decode(rec["input_ids"])
    assert text.count("Today Date:") == 1 and "dummy" not in text  # the delta is cut cleanly
    assert text.count("<tool_call>") == 1  # tools in the system message: the template ignores them


def test_check_on_names_the_changing_span_of_a_template_with_a_date(dated):
    with pytest.raises(ChatTemplateError) as err:
        run(dated, {2: ["ANSWER: -1", "ANSWER: -2"]}, tokenization_check="strict")
    message = str(err.value)
    assert "renders differently on each call" in message and "non-deterministic" in message
    assert "delta tokenization" not in message
    # "<|im_start|>system\nToday Date: " is 31 characters: the day's first or second digit
    assert re.search(r"at character 3[12]:", message)
    first, second = re.findall(r"Today Date: (\d\d Jul 2024)", message)  # both excerpts
    assert first != second


def test_the_end_of_episode_check_blames_the_template_not_the_deltas(dated):
    p = make_problem(0)  # answered right at once: no delta appended, only the final check
    with pytest.raises(ChatTemplateError, match="renders differently on each call"):
        run(dated, {0: [f"ANSWER: {p.answer}"]}, tokenization_check="ignore_strippable")
