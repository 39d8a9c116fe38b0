"""Token ids of chat-template text, tokenized piece by piece between added tokens, pieces cached.

Why: every agent prompt repeats the same system prompt and worked examples (about 500 of 600
tokens); tokenizing them again for every reply of every episode took 3.7 ms of the 5.5 ms a
prompt costs here, and on a GPU run that CPU time is time the GPU waits. A tokenizer cuts its
input at added tokens (`<|im_start|>`, `<|im_end|>`, …) before anything else, so the pieces between
them tokenize independently and the ids of a piece can be reused whenever it recurs.

That independence is a property of the tokenizer, so it is checked rather than assumed: the first
`VERIFY_CALLS` texts of each tokenizer are also tokenized whole, and any difference switches the
cache off for that tokenizer (with a warning) instead of changing a single id.

Both protocols tokenize through it: the action protocol's prompts, and every chat template text
(`ChatDeltas.encode`: windows, deltas, the OpenAI endpoint's renders on its own thread, hence
the lock).
"""

from __future__ import annotations

import logging
import re
import threading
import weakref
from collections import OrderedDict
from typing import Any

log = logging.getLogger(__name__)
VERIFY_CALLS = 32
MAX_PIECES = 8192


class PieceTokenizer:
    """`tokenizer(text, add_special_tokens=False)["input_ids"]`, piece by piece, with a cache."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        added = sorted(tokenizer.get_added_vocab(), key=len, reverse=True)
        self.split = re.compile("(" + "|".join(map(re.escape, added)) + ")") if added else None
        self.pieces: OrderedDict[str, list[int]] = OrderedDict()
        self.verify_left = VERIFY_CALLS
        self.enabled = self.split is not None
        self.lock = threading.Lock()

    def __call__(self, text: str) -> list[int]:
        with self.lock:
            if not self.enabled:
                return self._whole(text)
            ids = [t for piece in self.split.split(text) if piece for t in self._piece(piece)]
            if self.verify_left > 0:
                self.verify_left -= 1
                whole = self._whole(text)
                if whole != ids:
                    log.warning("tokenizing prompts piece by piece differs from whole-text "
                                "tokenization for %s: prompt token cache off",
                                type(self.tokenizer).__name__)
                    self.enabled = False
                    return whole
            return ids

    def _whole(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _piece(self, piece: str) -> list[int]:
        ids = self.pieces.get(piece)
        if ids is None:
            ids = self._whole(piece)
            self.pieces[piece] = ids
            if len(self.pieces) > MAX_PIECES:
                self.pieces.popitem(last=False)
        else:
            self.pieces.move_to_end(piece)
        return ids


_BY_TOKENIZER: "weakref.WeakKeyDictionary[Any, PieceTokenizer]" = weakref.WeakKeyDictionary()


def token_ids(tokenizer: Any, text: str) -> list[int]:
    """The ids of `text` (no special tokens added), through this tokenizer's piece cache."""
    cached = _BY_TOKENIZER.get(tokenizer)
    if cached is None:
        cached = _BY_TOKENIZER[tokenizer] = PieceTokenizer(tokenizer)
    return cached(text)


def expand_image_tokens(ids: list[int], image_token: tuple[int, int] | None) -> list[int]:
    """Each image token of `ids` repeated to the feature positions its image fills, as a LLaVA
    processor does (`image_token`: (id, tokens per image); None: `ids` as they are)."""
    if image_token is None:
        return list(ids)
    image_id, width = image_token
    out: list[int] = []
    for token in ids:
        out.extend([token] * width if token == image_id else [token])
    return out
