"""Delta tokenization and its sanity check, with the real SmolLM2 template and a Qwen3-style
template that strips earlier reasoning (the known case where deltas and re-rendering disagree)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from longturn.rollout.chat_deltas import ChatDeltas, ChatTemplateError
from longturn.rollout.tokenization_check import (TokenizationMismatch, check_tokenization,
                                                  compare)

# ChatML; assistant replies before the last user message lose their <think>…</think> part, as in
# Qwen3's template; tools are rendered natively.
QWEN3_STYLE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if tools -%}{{- '<|im_start|>system\\n# Tools\\n' -}}{%- for t in tools -%}"
    "{{- t | tojson -}}{%- endfor -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- for m in messages -%}{%- set content = m.content -%}"
    "{%- if m.role == 'assistant' and loop.index0 < ns.last_user and '</think>' in content -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}{%- endif -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")

CALC = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate arithmetic.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer_dir):
    return AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)


@pytest.fixture
def qwen3_style(smollm2_tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    tok.chat_template = QWEN3_STYLE
    return tok


class Episode:
    """Plays an episode the way the conversation rollout appends it: ids and messages side by
    side."""

    def __init__(self, deltas: ChatDeltas, first: list[dict]):
        self.deltas = deltas
        self.messages = deltas.prepare(first)
        self.ids = deltas.start(self.messages)
        self.mask = [0] * len(self.ids)

    def reply(self, text: str, stopped: bool = True, ids: list[int] | None = None) -> None:
        im_end = self.deltas.closing_ids[0]
        reply_ids = (ids if ids is not None else self.deltas.encode(text)) + ([im_end] if stopped else [])
        closing = self.deltas.close_reply(reply_ids)
        self.ids += reply_ids + closing
        self.mask += [1] * len(reply_ids) + [0] * len(closing)
        self.messages.append({"role": "assistant",
                              "content": self.deltas.reply_content(reply_ids)})

    def observe(self, messages: list[dict], generation_prompt: bool = True) -> None:
        delta = self.deltas.append(messages, generation_prompt)
        self.ids += delta
        self.mask += [0] * len(delta)
        self.messages += messages


FIRST = [{"role": "system", "content": "Solve it."}, {"role": "user", "content": "What is 2+3?"}]


def play(tokenizer, tools=None) -> Episode:
    ep = Episode(ChatDeltas(tokenizer, tools), FIRST)
    ep.reply('<think>add them</think>\n\n<tool_call>\n{"name": "calculator", "arguments": '
             '{"expression": "2+3"}}\n</tool_call>')
    ep.observe([{"role": "tool", "content": "5"}])
    ep.reply("The answer is 5.")
    ep.observe([{"role": "user", "content": "Are you sure?"}])
    ep.reply("Yes: 5.")
    return ep


def test_smollm2_deltas_equal_full_tokenization_and_mask_covers_only_replies(tokenizer):
    ep = play(tokenizer, [CALC])
    assert check_tokenization(ep.deltas, ep.messages, ep.ids, "strict").outcome == "identical"
    trained = ep.deltas.decode([t for t, m in zip(ep.ids, ep.mask) if m])
    assert trained == ('<think>add them</think>\n\n<tool_call>\n{"name": "calculator", '
                       '"arguments": {"expression": "2+3"}}\n</tool_call><|im_end|>'
                       "The answer is 5.<|im_end|>Yes: 5.<|im_end|>")


def test_template_without_tool_support_gets_the_schemas_in_the_system_message(tokenizer):
    deltas = ChatDeltas(tokenizer, [CALC])
    assert not deltas.native_tools
    system = deltas.prepare(FIRST)[0]["content"]
    assert system.startswith("Solve it.") and '"name": "calculator"' in system
    assert "<tool_call>" in system
    assert ChatDeltas(tokenizer).prepare(FIRST) == FIRST  # no tools, no preamble


def test_native_tool_template_renders_schemas_once(qwen3_style):
    deltas = ChatDeltas(qwen3_style, [CALC])
    assert deltas.native_tools and deltas.prepare(FIRST) == FIRST
    ep = Episode(deltas, FIRST)
    ep.reply("ok")
    ep.observe([{"role": "tool", "content": "5"}])
    assert deltas.decode(ep.ids).count("# Tools") == 1


def test_qwen3_style_reasoning_stripping_fails_strict_and_passes_ignore_strippable(qwen3_style):
    ep = play(qwen3_style)
    with pytest.raises(TokenizationMismatch) as err:
        check_tokenization(ep.deltas, ep.messages, ep.ids, "strict")
    assert "<think>add them</think>" in str(err.value) and "ignore_strippable" in str(err.value)
    result = check_tokenization(ep.deltas, ep.messages, ep.ids, "ignore_strippable")
    assert result.outcome == "strippable"
    assert check_tokenization(ep.deltas, ep.messages, ep.ids, "off").outcome == "skipped"


def test_a_real_difference_fails_even_ignore_strippable_and_names_the_span(tokenizer):
    ep = play(tokenizer)
    altered = [dict(m) for m in ep.messages]
    altered[3]["content"] = "6"  # the tool result as re-rendered is not the one appended
    with pytest.raises(TokenizationMismatch, match=r"deltas: '5' \| template: '6'"):
        check_tokenization(ep.deltas, altered, ep.ids, "ignore_strippable")


def test_whitespace_only_difference_is_strippable(tokenizer):
    ep = play(tokenizer)
    altered = [dict(m) for m in ep.messages]
    altered[-1]["content"] += "  \n"
    assert compare(ep.deltas, altered, ep.ids).outcome == "strippable"


def test_sampled_split_of_a_word_is_the_same_text_not_an_error(tokenizer):
    deltas = ChatDeltas(tokenizer)
    ep = Episode(deltas, FIRST)
    ep.reply("", ids=[deltas.encode(c)[0] for c in "Five"])  # one token per letter
    assert check_tokenization(deltas, ep.messages, ep.ids, "strict").outcome == "same_text"


def test_reply_cut_at_max_new_tokens_is_closed_by_the_template_text(tokenizer):
    ep = Episode(ChatDeltas(tokenizer), FIRST)
    ep.reply("The answer is", stopped=False)
    ep.observe([{"role": "user", "content": "Go on."}])
    result = check_tokenization(ep.deltas, ep.messages, ep.ids, "strict",
                                add_generation_prompt=True)
    assert result.outcome == "identical"
    assert ep.mask.count(1) == len(ep.deltas.encode("The answer is"))


def test_unknown_mode_names_the_key(tokenizer):
    ep = Episode(ChatDeltas(tokenizer), FIRST)
    with pytest.raises(Exception, match="rollout.tokenization_check"):
        check_tokenization(ep.deltas, ep.messages, ep.ids, "loose", add_generation_prompt=True)


def test_template_that_rewrites_earlier_messages_cannot_give_deltas(smollm2_tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    # marks the newest message: every message that follows changes the text before it
    tok.chat_template = ("{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\\n' + m.content"
                         " -}}{%- if loop.last -%}{{- ' (latest)' -}}{%- endif -%}"
                         "{{- '<|im_end|>\\n' -}}{%- endfor -%}")
    deltas = ChatDeltas(tok)
    with pytest.raises(ChatTemplateError, match="renders earlier messages differently"):
        deltas.append([{"role": "user", "content": "x"}])
