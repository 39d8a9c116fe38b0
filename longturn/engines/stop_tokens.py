"""Which sampled tokens end a turn: the same set for the in-process engine and an SGLang server."""

from __future__ import annotations

from typing import Any


def end_of_turn_ids(tokenizer: Any, generation_eos: int | list[int] | None) -> set[int]:
    """Tokenizer eos, the generation config's eos (an id or a list), and `<|im_end|>` if the
    vocab has it."""
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, generation_eos):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    im_end = tokenizer.get_vocab().get("<|im_end|>")
    if im_end is not None:
        ids.add(im_end)
    return ids
