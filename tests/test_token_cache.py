"""The prompt token cache: piecewise ids equal whole-text ids on real prompts of every env family,
with history; a tokenizer for which pieces differ switches the cache off without changing ids."""

from __future__ import annotations

import logging

import pytest
from transformers import AutoTokenizer

from longturn.agent import token_cache
from longturn.agent.token_cache import PieceTokenizer, token_ids
from longturn.envs.registry import make_env
from env_conversations import one_slot_batch
from longturn.params.config import parse_params

FAMILIES = [("babyai", "goto", {"num_dists": 0}), ("crafter", "default", {}),
            ("babaisai", "env/two_room-break_stop-make_win", {})]


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer_dir: str):
    return AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)


@pytest.mark.parametrize("family,task,kwargs", FAMILIES)
def test_cached_ids_equal_whole_text_ids(tokenizer, family, task, kwargs) -> None:
    """Six replies' prompts of the train rollout (episodes started again as they end): each
    one's ids are the tokenizer's on its whole text, and the cache's."""
    params = parse_params({"prompt": {"history_turns": 2, "max_prompt_tokens": 4096},
                           "env": {"name": family, "tasks": [task], "kwargs": kwargs,
                                   "workers": False, "step_timeout_s": None}})
    actions = make_env(family, task, **kwargs).actions
    samples = one_slot_batch(params, tokenizer, lambda k: (
        f"THINK: step {k}.\nACTION: {actions[k % len(actions)]}"), 6)
    pieces = PieceTokenizer(tokenizer)
    for sample in samples:
        whole = tokenizer(sample["prompt_text"], add_special_tokens=False)["input_ids"]
        assert pieces(sample["prompt_text"]) == whole == sample["prompt_ids"]
    assert len(samples) == 6 and samples[-1]["bootstrap_prompt_ids"] is not None
    assert pieces.enabled and len(pieces.pieces) > 3  # the shared pieces were reused


class SplitSensitive:
    """A stand-in tokenizer whose ids depend on where the text is cut (one id per text)."""

    def get_added_vocab(self) -> dict[str, int]:
        return {"<|sep|>": 0}

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [hash(text) % 1000]}


def test_a_tokenizer_that_splits_differently_turns_the_cache_off(caplog) -> None:
    fake = SplitSensitive()
    with caplog.at_level(logging.WARNING, logger=token_cache.__name__):
        ids = token_ids(fake, "a<|sep|>b")
    assert ids == fake("a<|sep|>b")["input_ids"]
    assert "prompt token cache off" in caplog.text
    assert token_ids(fake, "c<|sep|>d") == fake("c<|sep|>d")["input_ids"]


def test_chat_windows_are_tokenized_through_the_cache(tokenizer) -> None:
    """A conversation's window renders the task's messages again for every reply: their pieces
    come from the cache, and the ids are the tokenizer's own."""
    from longturn.rollout.chat_deltas import ChatDeltas

    deltas = ChatDeltas(tokenizer)
    task = [{"role": "system", "content": "You add numbers. " * 40},
            {"role": "user", "content": "What is 12 + 30?"}]
    for turn in range(3):
        window = task + [{"role": "assistant", "content": f"Try {turn}."},
                         {"role": "user", "content": f"Not {turn}, again."}]
        text = deltas.render(window, add_generation_prompt=True)
        assert deltas.start(window) == list(tokenizer.encode(text, add_special_tokens=False))
    cached = token_cache._BY_TOKENIZER[tokenizer].pieces
    assert any("You add numbers." in piece for piece in cached)


def test_the_tokenization_check_compares_with_the_tokenizer_not_the_cache(tokenizer) -> None:
    """The check's reference is an independent tokenization: a wrong cached piece must not make
    wrong delta ids look identical."""
    from longturn.rollout.chat_deltas import ChatDeltas
    from longturn.rollout.tokenization_check import compare

    deltas = ChatDeltas(tokenizer)
    messages = [{"role": "user", "content": "a question"},
                {"role": "assistant", "content": "an answer"}]
    text = deltas.render(messages, add_generation_prompt=False)
    right = list(tokenizer.encode(text, add_special_tokens=False))
    assert compare(deltas, messages, right).outcome == "identical"
    deltas.encode(text)
    pieces = token_cache._BY_TOKENIZER[tokenizer]
    pieces.verify_left = 0
    answer = next(piece for piece in pieces.pieces if "an answer" in piece)
    pieces.pieces[answer] = [0]  # a poisoned piece
    poisoned = deltas.encode(text)
    assert poisoned != right
    assert compare(deltas, messages, poisoned).outcome != "identical"
    pieces.pieces.clear()
