"""What the endpoint keeps of every answered call, per episode: the exact tokens the model saw and
sampled, so an agent never has to hand tokens back for training.

Why per episode, keyed by the URL: an agent is given a base URL that holds its episode id
(`/episodes/<id>/v1`), so whatever client or framework it uses, every call it makes lands in its
own episode without the agent passing anything. A call of an episode not opened (or already
closed) is refused (404), so a late call of an aborted agent cannot slip into another record.

The book is written on the server's event loop and read from the caller's thread: one lock.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from dataclasses import dataclass, field
from typing import Any

EPISODE_ID = re.compile(r"[A-Za-z0-9._~-]{1,200}")  # as it stands in a URL path, unescaped


class EpisodeNotOpen(KeyError):
    """A call or a read of an episode that is not open (never opened, or closed)."""


@dataclass(frozen=True)
class CallRecord:
    """One answered chat completion."""

    index: int  # the call's place in its episode's record (answer order)
    request_index: int  # the request's arrival number in the episode (its seed, its call ids)
    messages: list[dict[str, Any]]  # as the agent sent them
    rendered_messages: list[dict[str, Any]]  # as the template rendered them (tool preamble in)
    tools: list[dict[str, Any]]
    prompt_ids: list[int]  # exactly what the engine was given
    response_ids: list[int]  # exactly what it sampled (cut to the request's max tokens)
    logprobs: list[float]  # untempered policy logprob per response token
    finish_reason: str  # the engine's: stop or length
    reply_text: str  # the reply's text without the sampled end-of-turn token
    reply: dict[str, Any]  # the assistant message returned (content or tool_calls)
    reply_finish_reason: str  # as returned: stop, length or tool_calls
    seed: int | None
    max_new_tokens: int
    requested: dict[str, Any]  # the sampling fields the agent asked for (not used: the run's)


@dataclass
class _Episode:
    calls: list[CallRecord] = field(default_factory=list)
    requests: int = 0  # requests accepted so far (the next request's index)
    replies: dict[str, str] = field(default_factory=dict)  # tool-call id → the reply's text


class EpisodeBook:
    """The open episodes and their calls."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, _Episode] = {}

    def open(self, episode_id: str) -> None:
        if not EPISODE_ID.fullmatch(episode_id):
            raise ValueError(f"episode id {episode_id!r}: use 1-200 of A-Z a-z 0-9 . _ ~ -")
        with self._lock:
            if episode_id in self._open:
                raise ValueError(f"episode {episode_id!r} is already open")
            self._open[episode_id] = _Episode()

    def _episode(self, episode_id: str) -> _Episode:
        episode = self._open.get(episode_id)
        if episode is None:
            raise EpisodeNotOpen(episode_id)
        return episode

    def close(self, episode_id: str) -> list[CallRecord]:
        """The episode's calls; later calls of it are refused."""
        with self._lock:
            calls = self._episode(episode_id).calls
            del self._open[episode_id]
            return calls

    def calls(self, episode_id: str) -> list[CallRecord]:
        with self._lock:
            return list(self._episode(episode_id).calls)

    def is_open(self, episode_id: str) -> bool:
        with self._lock:
            return episode_id in self._open

    def open_count(self) -> int:
        with self._lock:
            return len(self._open)

    def replies(self, episode_id: str) -> dict[str, str]:
        """Tool-call id → reply text, of the calls answered so far."""
        with self._lock:
            return dict(self._episode(episode_id).replies)

    def accept(self, episode_id: str) -> int:
        """Count a checked request in; its index in the episode."""
        with self._lock:
            episode = self._episode(episode_id)
            episode.requests += 1
            return episode.requests - 1

    def record(self, episode_id: str, record: CallRecord, call_ids: list[str]
               ) -> CallRecord | None:
        """Keep an answered call (its `index` set here); None when the episode was closed while
        it was generated (the call is then not answered either)."""
        with self._lock:
            episode = self._open.get(episode_id)
            if episode is None:
                return None
            record = dataclasses.replace(record, index=len(episode.calls))
            episode.calls.append(record)
            episode.replies.update(dict.fromkeys(call_ids, record.reply_text))
            return record
