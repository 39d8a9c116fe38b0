"""KL to the reference by THINK / ACTION part is logged only where replies have the split: a
batch without an ACTION tag (chat replies, or a model that never wrote one) logs neither, rather
than an ACTION KL of 0 that reads as no drift."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoTokenizer

from longturn.algo.ppo import think_action_masks
from longturn.algo.ppo_steps import split_kl


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer_dir: str):
    return AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)


def _kl(tokenizer, replies: list[str]) -> dict[str, float]:
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in replies]
    width = max(map(len, ids))
    think, action = think_action_masks(ids, tokenizer, width=width)
    valid = torch.zeros(len(ids), width, dtype=torch.bool)
    for row, r in enumerate(ids):
        valid[row, :len(r)] = True
    kl = torch.where(action, torch.tensor(0.5), torch.tensor(0.1))
    return split_kl(kl, valid, think, action)


def test_replies_with_an_action_tag_split_the_kl(tokenizer) -> None:
    m = _kl(tokenizer, ["THINK: the key is left. ACTION: turn left", "no tag here"])
    assert math.isclose(m["kl_think"], 0.1, rel_tol=1e-6)
    assert math.isclose(m["kl_action"], 0.5, rel_tol=1e-6)


def test_without_any_action_tag_neither_part_is_logged(tokenizer) -> None:
    m = _kl(tokenizer, ["<tool_call>{\"name\": \"calculator\"}</tool_call>", "The answer is 4."])
    assert math.isnan(m["kl_think"]) and math.isnan(m["kl_action"])
