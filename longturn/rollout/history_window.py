"""The history window of a conversation (`rollout.context: window`): what one reply is
given instead of the whole episode.

Why: when the whole episode is the prompt (verl, slime), reply 100 of a long tool episode costs
100 turns of context. Verlog's turn-level method gives each reply the task and its last N turns
only, so a late reply costs what an early one does. Here that window is cut from the episode's
messages and rendered fresh by the chat template (`ChatDeltas.start`, tool schemas included):
- the episode's leading messages, everything the task gave before the first reply (system,
  worked example, the problem or the first observation), always;
- then its last N turns (`prompt.history_turns`), a turn being an assistant message and the
  messages after it (tool results, the user's or the env's answer);
- the frames of those messages only, each placed at its `<image>` placeholder run.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from longturn.rollout.chat_deltas import ChatDeltas
from longturn.vision.encoder import IMAGE_PLACEHOLDER


@dataclass(frozen=True)
class WindowPrompt:
    """One rendered window: the prompt ids, which of the episode's frames it holds and where
    each one's placeholders begin in `ids`."""

    ids: list[int]
    frames: list[int]  # indices into the episode's frames, in order
    starts: list[int]  # where each of those frames' placeholder runs begins in ids
    # an action protocol's prompt (an env's episode, `action_view`) also says, for its sample:
    text: str | None = None  # the prompt's text
    history_dropped: int | None = None  # past steps dropped to fit prompt.max_prompt_tokens
    observation: str | None = None  # the observation it answers, as the env wrote it


class Joined(Sequence):
    """Two lists read as one, not copied: an episode's messages (or frame owners) and those
    about to be appended, whose window is rendered before they are."""

    def __init__(self, first: Sequence[Any], then: Sequence[Any]):
        self.first, self.then = first, then

    def __len__(self) -> int:
        return len(self.first) + len(self.then)

    def __getitem__(self, i: int) -> Any:  # type: ignore[override]  (no slices)
        i = i + len(self) if i < 0 else i
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.first[i] if i < len(self.first) else self.then[i - len(self.first)]


def window_messages(messages: Sequence[dict[str, Any]], head: int, turns: int) -> list[int]:
    """Indices of the messages in the window: the first `head` (the task's), then the last
    `turns` turns of the rest, each starting at an assistant message. Read from the end, so a
    reply deep into a long episode costs what an early one does."""
    if turns < 1:
        raise ValueError(f"a history window of {turns} turns shows no reply")
    first, seen = head, 0
    for i in range(len(messages) - 1, head - 1, -1):
        if messages[i]["role"] == "assistant":
            seen += 1
            if seen == turns:
                first = i
            elif seen > turns:  # an older turn exists: the window starts at the newest `turns`
                break
    else:  # no turn before the window's first: it shows everything after the task's
        first = head
    return [*range(head), *range(first, len(messages))]


def frame_owners(messages: Sequence[dict[str, Any]], frames: int, offset: int) -> list[int]:
    """The message each of `frames` frames belongs to, the frames given with `messages` (whose
    first has index `offset` in the episode): by each message's `<image>` placeholders, in
    order; all to the last message when the counts disagree (the rendering check then names
    the mismatch)."""
    counts = [str(m.get("content", "")).count(IMAGE_PLACEHOLDER) for m in messages]
    if sum(counts) != frames:
        return [offset + len(messages) - 1] * frames
    return [offset + i for i, n in enumerate(counts) for _ in range(n)]


def window_frames(owners: Sequence[int], head: int, first: int) -> list[int]:
    """The frames of a window of the task's `head` messages and the messages from `first` on:
    found by bisection, as owners never decrease (frames come in message order)."""
    return [*range(bisect_left(owners, head)), *range(bisect_left(owners, first), len(owners))]


def render_window(deltas: ChatDeltas, messages: Sequence[dict[str, Any]],
                  owners: Sequence[int], head: int, turns: int, where: str) -> WindowPrompt:
    """The window of the next reply, rendered with the generation prompt; `owners[j]` is the
    message frame j belongs to (`frame_owners`)."""
    picked = window_messages(messages, head, turns)
    ids = deltas.start([messages[i] for i in picked])
    frames = window_frames(owners, head, picked[head] if len(picked) > head else len(messages))
    return WindowPrompt(ids, frames, deltas.image_starts(ids, len(frames), where))
