"""One conversation (an episode of the chat protocol): a token sequence that only grows, with
its loss mask, the sampling logprobs of the model's tokens, and the message list it stands for.

An assistant segment is one reply: its sampled ids (loss mask 1), then the template's closing of
the turn (mask 0). Everything else (the first messages, tool results, user feedback) is context
(mask 0). Each segment carries the reward given right after it (tool step rewards, the
interaction's score), so GAE can treat segments as turns: the step discount applies at each
observation gap.

Image observations (a vision-language model): each image's placeholder run in the context is
recorded by its start, and the frames are buffered per turn; engine and trainer encode all of an
episode's frames together, once per forward, and put the features at those starts. Each frame
also keeps the message it came with, so a history window can pick the frames of its messages.

With a history window (`rollout.context: window`, rollout/history_window.py) the growing
sequence is still kept (messages, tool calls, the tokenization check), but what the model is
given for each reply is its window: `window` is the next one, and each reply's window and lock-step
are recorded for its own sample (rollout/samples.py). A fixed-turn batch takes the record of the
replies it has not yet handed on (`record(first)`) and lets go of their windows (`let_go`), so
what a batch costs does not grow with the episode.
"""

from __future__ import annotations

import json
from array import array
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from longturn.envs.actions import ParsedAction
from longturn.rollout.chat_deltas import ChatDeltas
from longturn.rollout.history_window import WindowPrompt, frame_owners
from longturn.rollout.samples import CONVERSATION_COLUMNS
from longturn.tasks.tools import is_error_text
from longturn.vision.frames import to_png

# Why an episode ended. All but `done` cut it short: truncated, bootstrapped where a critic exists.
DONE = "done"  # the interaction (or the reply without a tool call) ended it
MAX_ASSISTANT_TURNS = "max_assistant_turns"
MAX_USER_TURNS = "max_user_turns"
TOKEN_BUDGET = "token_budget"
TIME_LIMIT = "time_limit"  # the interaction ended it on a time limit (an env's `truncated`)
# an agent's episode (rollout.agent, serve/agent_rollout.py) aborted: the agent raised, or did
# not return in time; its calls are out of the loss
AGENT_ERROR, AGENT_TIMEOUT = "agent_error", "timeout"
# aborted by the env behind its interaction (envs/termination.py: it raised, or hung: `timeout`)
ENV_ERROR = "env_error"
REASONS = (DONE, MAX_ASSISTANT_TURNS, MAX_USER_TURNS, TOKEN_BUDGET, TIME_LIMIT, AGENT_ERROR,
           AGENT_TIMEOUT, ENV_ERROR)


@dataclass
class Conversation:
    """The growing sequence of one episode and the counters its termination rules read."""

    episode_id: str
    task: dict[str, Any]
    deltas: ChatDeltas
    messages: list[dict[str, Any]] = field(default_factory=list)
    # the sequence in typed arrays: a long episode keeps 13 bytes a token, not a list's ~50
    ids: array = field(default_factory=lambda: array("i"))
    loss_mask: array = field(default_factory=lambda: array("b"))
    logprobs: array = field(default_factory=lambda: array("d"))
    segments: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of sampled ids
    segment_rewards: list[float] = field(default_factory=list)
    finish_reasons: list[str | None] = field(default_factory=list)  # per reply: stop | length
    # per reply: no tool call of it failed, and the action it named was valid (an env's)
    reply_valid: list[bool] = field(default_factory=list)
    # per reply, what an env's interaction read it as (`read_as_action`; None: not an action)
    reply_actions: list[dict[str, Any] | None] = field(default_factory=list)
    reply_texts: list[str | None] = field(default_factory=list)  # per reply: its content
    assistant_turns: int = 0
    user_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    reason: str | None = None
    aborted: bool = False  # ended by a failure outside the model
    # the first reply out of the loss when aborted: 0 (an agent's failure: none of its replies
    # trains), or the reply whose env step failed (the replies before it acted on an env that
    # answered, and train)
    aborted_from: int = 0
    check: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    # frames, in sequence order; None once no window can show it again (`let_go`)
    images: list[np.ndarray | None] = field(default_factory=list)
    frames_let_go: int = 0  # frames before this one (but the task's) are None
    image_starts: list[int] = field(default_factory=list)  # where each one's placeholders begin
    frame_owner: list[int] = field(default_factory=list)  # per frame, the message it came with
    head: int = 0  # the task's messages, before the first reply
    window: WindowPrompt | None = None  # what the next reply is given (None: the whole sequence)
    # (step, window) of each reply; None once handed on (`let_go`)
    windows: list[tuple[int, WindowPrompt] | None] = field(default_factory=list)
    handed_on: int = 0  # replies let go of

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without its template deltas (they hold the tokenizer): a resumed run's
        player gives it its own."""
        return {**self.__dict__, "deltas": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A checkpoint resumes across an upgrade: one pickled before replies were read as
        actions, or their texts kept, has none."""
        self.__dict__.update({"reply_actions": [None] * len(state["segments"]),
                              "reply_texts": [None] * len(state["segments"]), **state})

    @classmethod
    def begin(cls, episode_id: str, task: dict[str, Any], deltas: ChatDeltas) -> "Conversation":
        ep = cls(episode_id, task, deltas, messages=deltas.prepare(task["messages"]))
        ep.head = len(ep.messages)
        images = list(task.get("images") or [])
        ep._context(deltas.start(ep.messages), images)
        ep.frame_owner += frame_owners(ep.messages, len(images), 0)
        return ep

    @property
    def done(self) -> bool:
        return self.reason is not None

    def _context(self, ids: list[int], images: list[np.ndarray] = ()) -> None:
        """Append context ids, recording where each image of them starts (placeholders and
        frames must match one to one)."""
        if images or self.deltas.image_token is not None:
            starts = self.deltas.image_starts(ids, len(images), f"episode {self.episode_id}")
            self.image_starts += [len(self.ids) + s for s in starts]
            self.images += images
        self.ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))

    def given(self) -> tuple[list[int], list[tuple[int, np.ndarray]]]:
        """What the model is given for the next reply: its window, or the whole sequence; the
        prompt ids and each frame with where its placeholders begin."""
        if self.window is None:
            return list(self.ids), list(zip(self.image_starts, self.images))
        w = self.window
        return w.ids, [(start, self.images[j]) for start, j in zip(w.starts, w.frames)]

    def add_reply(self, reply_ids: list[int], logprobs: list[float], step: int = 0,
                  finish_reason: str | None = None, plain: bool = False) -> str:
        """Append a sampled reply (generated at lock-step `step`, ended for `finish_reason`:
        stop or length) and the template's closing; returns the reply's content: the template's
        text, or (`plain`) its text without special tokens, as the action parser reads a reply."""
        if self.window is not None:
            self.windows.append((step, self.window))
        start = len(self.ids)
        self.ids.extend(reply_ids)
        self.loss_mask.extend([1] * len(reply_ids))
        self.logprobs.extend(logprobs[:len(reply_ids)])
        self.segments.append((start, len(self.ids)))
        self.segment_rewards.append(0.0)
        self.finish_reasons.append(finish_reason)
        self.reply_valid.append(True)  # until one of its tool calls fails
        self.reply_actions.append(None)
        self._context(self.deltas.close_reply(reply_ids))
        content = (self.deltas.tokenizer.decode(reply_ids, skip_special_tokens=True) if plain
                   else self.deltas.reply_content(reply_ids))
        self.reply_texts.append(content)
        self.messages.append({"role": "assistant", "content": content})
        self.assistant_turns += 1
        return content

    def add_messages(self, messages: list[dict[str, Any]], delta_ids: list[int],
                     images: list[np.ndarray] = ()) -> None:
        """Append tool results or a user turn: their template delta (`ChatDeltas.append`),
        as context, with the frames its `<image>` placeholders stand for."""
        self._context(delta_ids, images)
        self.frame_owner += frame_owners(messages, len(images), len(self.messages))
        self.messages += messages

    def keep_frame(self, frame: np.ndarray) -> None:
        """Keep a frame no message of the episode carries (an ended episode's last observation,
        which its bootstrap prompt shows): it has no place in the sequence."""
        self.images.append(frame)
        self.frame_owner.append(len(self.messages))

    def reward(self, value: float, metrics: dict[str, Any] | None = None) -> None:
        """Credit the latest reply; numeric metrics are summed per episode."""
        self.segment_rewards[-1] += float(value)
        for key, v in (metrics or {}).items():
            if isinstance(v, (int, float)):
                self.metrics[key] = self.metrics.get(key, 0.0) + float(v)

    def read_as_action(self, parsed: ParsedAction, env_reward: float | None = None) -> None:
        """The latest reply, as an env read it: the action columns of its sample (and the env's
        reward for it, before the invalid-action penalty, where the interaction said it); a reply
        that named no valid action is not valid."""
        self.reply_actions[-1] = {"raw_action": parsed.raw_action, "action": parsed.action,
                                  "action_failure": parsed.failure,
                                  "env_reward": None if env_reward is None else float(env_reward)}
        self.reply_valid[-1] = self.reply_valid[-1] and parsed.valid

    def end(self, reason: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown termination reason {reason!r}")
        self.reason = reason

    def abort(self, reason: str, last_reply_only: bool = False) -> None:
        """End it for a failure outside the model: an agent that failed (every reply out of the
        loss), or with `last_reply_only` an env that raised or hung on the last reply's step
        (that reply alone)."""
        self.aborted = True
        self.aborted_from = max(len(self.segments) - 1, 0) if last_reply_only else 0
        self.end(reason)

    def record(self, first: int = 0, totals: bool = True) -> dict[str, Any]:
        """The episode as the rollout's record (docs/design.md §4b); with a history window also
        each reply's window and lock-step, and the window a next reply would have seen when the
        episode was cut short (`window` once it ended: its bootstrap).

        `first`: only the replies from that one on (what a fixed-turn batch has not yet handed
        on); their token lists then start after reply first-1, and with a window its frames are
        those their windows show. `totals`: with the episode's own columns (messages, metrics,
        counts, the check), else None there. So what a part of a long episode costs does not
        grow with the episode."""
        offset = self.segments[first - 1][1] if first else 0
        out = {**self._record(first, offset),
               **(self._totals() if totals else dict.fromkeys(CONVERSATION_COLUMNS))}
        if self.windows:
            out.update(self._window_record(first))
        return out

    def let_go(self, replies: int) -> None:
        """The first `replies` replies are handed on: their windows are no longer kept, nor the
        frames that no later window can show (windows only move on; the task's frames stay)."""
        for k in range(self.handed_on, min(replies, len(self.windows))):
            self.windows[k] = None
        self.handed_on = max(self.handed_on, replies)
        kept = [entry[1] for entry in self.windows[replies:] if entry is not None]
        task_frames = bisect_left(self.frame_owner, self.head)
        oldest = min((j for w in [*kept, self.window] if w is not None for j in w.frames
                      if j >= task_frames), default=len(self.images))
        for j in range(max(self.frames_let_go, task_frames), oldest):
            self.images[j] = None
        self.frames_let_go = max(self.frames_let_go, oldest)

    def _window_record(self, first: int) -> dict[str, Any]:
        windows = self.windows[first:]
        bootstrap = self.window if self.window is not None and self.reason != DONE else None
        shown = [*(w for _, w in windows), *([bootstrap] if bootstrap is not None else [])]
        # a part's frames: those its windows show, numbered in the order they came
        local = ({j: j for j in range(len(self.images))} if first == 0 else
                 {j: n for n, j in enumerate(sorted({j for w in shown for j in w.frames}))})
        out: dict[str, Any] = {
            "reply_steps": [step for step, _ in windows],
            "window_prompts": [list(w.ids) for _, w in windows],
            "window_frames": [[local[j] for j in w.frames] for _, w in windows],
            "window_image_starts": [list(w.starts) for _, w in windows]}
        if windows and windows[0][1].observation is not None:  # action protocol's prompts
            out.update(reply_observations=[w.observation for _, w in windows],
                       window_texts=[w.text for _, w in windows],
                       window_history_dropped=[w.history_dropped for _, w in windows])
        if first:
            out["images"] = [to_png(self.images[j]) for j in local]
        if bootstrap is not None:
            out.update(bootstrap_prompt_ids=list(bootstrap.ids),
                       bootstrap_frames=[local[j] for j in bootstrap.frames],
                       bootstrap_image_starts=list(bootstrap.starts))
        return out

    def _record(self, first: int, offset: int) -> dict[str, Any]:
        return {
            "episode_id": self.episode_id, "task": self.task.get("task", ""),
            "episode_seed": int(self.task.get("seed", 0)),
            "input_ids": self.ids[offset:].tolist(), "loss_mask": self.loss_mask[offset:].tolist(),
            "engine_logprobs": self.logprobs[offset:].tolist(),
            "segment_starts": [s - offset for s, _ in self.segments[first:]],
            "segment_ends": [e - offset for _, e in self.segments[first:]],
            "segment_rewards": self.segment_rewards[first:],
            "reply_finish_reasons": self.finish_reasons[first:],
            "reply_valid": self.reply_valid[first:],
            "reply_actions": self.reply_actions[first:],
            "reply_texts": self.reply_texts[first:], "env_name": self.task.get("env_name"),
            "reward": float(sum(self.segment_rewards)), "termination": self.reason,
            "truncated": self.reason != DONE and not self.aborted, "aborted": self.aborted,
            # its replies from this one on are out of the loss (counted in this part)
            "aborted_from": max(self.aborted_from - first, 0),
            # a part's frames are those its windows show (`_window_record`)
            "images": None if first else [to_png(frame) for frame in self.images],
            "image_starts": None if first else list(self.image_starts),
        }

    def _totals(self) -> dict[str, Any]:  # samples.py CONVERSATION_COLUMNS
        return {"assistant_turns": self.assistant_turns, "user_turns": self.user_turns,
                "tool_calls": self.tool_calls, "tool_errors": self.tool_errors,
                "tokenization_check": self.check, "messages": json.dumps(self.messages),
                "metrics": json.dumps(self.metrics)}


def replies_valid(messages: list[dict[str, Any]], made: int) -> list[bool]:
    """Whether each of the last `made` replies of `messages` was valid (no tool message answering it
    reads as an error: tasks/tools.py `is_error_text`), for a record whose rollout did not say
    (`reply_valid`): an agent's, slime's or a rollout function's. The task's first messages may hold
    a worked example's replies, which are not the model's; a reply the messages do not show on its
    own (a slime function's replies are one message) had no failed tool result."""
    shown: list[bool] = []
    for message in messages:
        if message["role"] == "assistant":
            shown.append(True)
        elif message["role"] == "tool" and shown and is_error_text(message["content"]):
            shown[-1] = False
    return shown[max(0, len(shown) - made):] + [True] * (made - len(shown))
