"""The built-in conversation rollout (the chat protocol): a batch of tasks played as growing
token sequences, every active episode's next reply generated in one engine call.

After each reply:
- tool calls in it (Hermes format) are run through the ToolBox; their results, errors included,
  are appended as `tool` messages and the model replies again (whatever parsing or running a
  call raises is such an `Error: …` message too: model text never ends the run);
- a reply without tool calls goes to the interaction, which scores it and either ends the episode
  (`time_limit` when it says the episode was cut by a time limit, else `done`) or answers as the
  user; without an interaction such a reply ends the episode;
- limits end it too: `max_assistant_turns`, `max_user_turns`, `max_tokens` (the token budget of
  what a reply is given plus the reply: a reply is cut to fit, and no context is appended past
  it).

What the model is given for a reply is one setting, `context`: the whole episode (`episode`,
verl / slime), or its history window (`window`, rollout/history_window.py: the task's messages
and the last `history_turns` turns, rendered fresh). Either way the episode's sequence grows as
below and is checked at the end; in a window only the prompts change, and the token budget
bounds each window and its reply instead of the whole episode.
When an episode ends, the template's closing follows its last reply, the accumulated ids are
checked against a full re-rendering (`tokenization_check`), and tools and interaction release it.

Images: a task record's `images` (one frame per `<image>` in its messages), and an interaction
that answers with an `Observation` carrying a frame, give image observations. The engine is then
given each prompt's frames and where they go; it needs a vision-language model (`vision/`).

It is registered as `longturn.rollout.conversation_rollout:conversation_rollout`;
`rollout.chat.function` may name any function with the same signature and records
(docs/conversations.md).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from tqdm.auto import tqdm

from longturn.engines.base import Engine, SamplingParams
from longturn.envs.base import Observation
from longturn.errors import SettingError
from longturn.rollout.chat_deltas import ChatDeltas
from longturn.rollout.history_window import frame_owners, render_window
from longturn.rollout.conversation import (DONE, MAX_ASSISTANT_TURNS, MAX_USER_TURNS, TIME_LIMIT,
                                       TOKEN_BUDGET, Conversation)
from longturn.tasks.interactions import BaseInteraction
from longturn.rollout.tokenization_check import check_tokenization
from longturn.tasks.tool_calls import BadToolCall, ToolCall, parse_tool_calls
from longturn.tasks.tools import ToolBox, ToolResult
from longturn.vision.encoder import IMAGE_PLACEHOLDER

if TYPE_CHECKING:
    from longturn.params.config import ChatParams

log = logging.getLogger(__name__)

EPISODE, WINDOW = "episode", "window"  # rollout.context: what a reply is given


@dataclass
class ConversationSettings:
    """Everything a conversation rollout needs besides the engine, tokenizer, sampling and tasks.

    No defaults of its own: `from_config` reads the limits from rollout.chat, the one place
    defaults live; the objects a run loads (tools, interaction, reward) are passed explicitly."""

    max_assistant_turns: int
    max_user_turns: int
    max_tokens: int
    max_tool_response_chars: int
    tokenization_check: str
    context: str  # EPISODE: a reply is given the whole episode; WINDOW: its history window
    history_turns: int  # the turns of a window
    tools: ToolBox | None
    interaction: BaseInteraction | None
    reward_fn: Callable[[dict[str, Any], list[dict[str, Any]]], float] | None
    progress: bool

    @classmethod
    def from_config(cls, section: ChatParams, *, context: str, history_turns: int,
                    tools: ToolBox | None,
                    interaction: BaseInteraction | None,
                    reward_fn: Callable[[dict[str, Any], list[dict[str, Any]]], float] | None,
                    progress: bool) -> ConversationSettings:
        """rollout.chat's limits, rollout.context and the window's turns (prompt.history_turns,
        the same keys as an env slot's window), plus what the run loaded from its files."""
        if context == WINDOW and history_turns < 1:
            raise SettingError("rollout.context window with prompt.history_turns 0 "
                               "would show no reply and no tool result: set it to 1 or more")
        return cls(max_assistant_turns=section.max_assistant_turns,
                   max_user_turns=section.max_user_turns, max_tokens=section.max_tokens,
                   max_tool_response_chars=section.max_tool_response_chars,
                   tokenization_check=section.tokenization_check, context=context,
                   history_turns=history_turns, tools=tools, interaction=interaction,
                   reward_fn=reward_fn, progress=progress)


def _tool_turn(ep: Conversation, tools: ToolBox, calls: list, limit: int
               ) -> list[dict[str, Any]]:
    """Run a reply's calls; the tool messages to append."""
    out = []
    for call in calls:
        result = _run_call(ep.episode_id, tools, call)
        ep.tool_calls += 1
        ep.tool_errors += result.error is not None
        ep.reward(result.reward, result.metrics)
        text = result.text if len(result.text) <= limit else result.text[:limit] + " …(cut)"
        out.append({"role": "tool", "name": result.name or "error", "content": text})
    return out


def _read_calls(content: str) -> list[ToolCall | BadToolCall]:
    """The reply's tool calls. The parser never raises by design; should it ever, the reply is
    one bad call: the model reads an `Error:` message and the episode goes on."""
    try:
        return parse_tool_calls(content)
    except Exception as err:  # model text must not end the run
        log.warning("reading the tool calls of a reply raised", exc_info=True)
        return [BadToolCall(content, f"the tool calls could not be read ({type(err).__name__})")]


def _run_call(instance_id: str, tools: ToolBox, call: ToolCall | BadToolCall) -> ToolResult:
    """One call's result; whatever the tool box or the tool raises becomes an `Error:` result
    (ToolBox.call catches a tool's own exceptions; this is the last guard, for anything else)."""
    try:
        return tools.call(instance_id, call)
    except Exception as err:  # a tool's bug must not end the run; it is logged in full
        name = call.name if isinstance(call, ToolCall) else ""
        log.warning("tool call %r raised", name, exc_info=True)
        first_line = (str(err).splitlines() or [""])[0]
        return ToolResult(name, f"Error: the tool call failed: {type(err).__name__}: "
                          f"{first_line}", error="tool_exception")


def _user_message(text: str | Observation) -> tuple[dict[str, Any], list]:
    """An interaction's answer as a user message and its frames (an Observation with an image
    gets an `<image>` line before its text)."""
    if not isinstance(text, Observation):
        return {"role": "user", "content": text}, []
    if text.image is None:
        return {"role": "user", "content": text.text}, []
    return {"role": "user", "content": f"{IMAGE_PLACEHOLDER}\n{text.text}"}, [text.image]


def _after_reply(ep: Conversation, content: str, s: ConversationSettings
                 ) -> tuple[list[dict], list] | None:
    """Decide what follows a reply: the messages to append and their frames, or None when the
    episode ended."""
    calls = _read_calls(content) if s.tools is not None else []
    if calls:
        messages = _tool_turn(ep, s.tools, calls, s.max_tool_response_chars)
        if ep.assistant_turns >= s.max_assistant_turns:
            ep.end(MAX_ASSISTANT_TURNS)
            return None
        return messages, []
    if s.interaction is None:
        if s.reward_fn is not None:
            ep.reward(s.reward_fn(ep.task, ep.messages))
        ep.end(DONE)
        return None
    stop, text, score, metrics = s.interaction.generate_response(ep.episode_id, ep.messages)
    ep.reward(score, metrics)
    if stop:
        ep.end(TIME_LIMIT if s.interaction.truncated(ep.episode_id) else DONE)
        return None
    if ep.assistant_turns >= s.max_assistant_turns:
        ep.end(MAX_ASSISTANT_TURNS)
        return None
    if ep.user_turns >= s.max_user_turns:
        ep.end(MAX_USER_TURNS)
        return None
    ep.user_turns += 1
    message, images = _user_message(text)
    return [message], images


def _finish(ep: Conversation, s: ConversationSettings) -> dict[str, Any]:
    """Credit the tools' episode rewards, release tools and interaction, run the check; in a
    window, keep the window a next reply would have seen when the episode was cut short (its
    bootstrap)."""
    try:
        if ep.windows:
            ep.window = None if ep.reason == DONE else _next_window(ep, s, ep.messages,
                                                                    ep.frame_owner)
        if s.tools is not None and ep.segments:  # no reply fitted: nothing to credit
            for name, value in s.tools.rewards(ep.episode_id).items():
                if value:
                    ep.reward(value, {f"{name}_reward": value})
        # the sequence ends with a reply's closing, or (no reply fitted) the generation prompt
        ep.check = check_tokenization(ep.deltas, ep.messages, ep.ids, s.tokenization_check,
                                      add_generation_prompt=not ep.segments,
                                      where=f"episode {ep.episode_id}").outcome
    finally:
        if s.tools is not None:
            s.tools.release(ep.episode_id)
        if s.interaction is not None:
            s.interaction.finalize(ep.episode_id)
    return ep.record()


def conversation_rollout(engine: Engine, tokenizer: Any, sampling: SamplingParams,
                     tasks: list[dict[str, Any]], settings: ConversationSettings,
                     id_prefix: str = "seq") -> list[dict[str, Any]]:
    """Play every task to its end; one record per task, in task order."""
    s = settings
    vision = getattr(engine, "vision", None)
    deltas = ChatDeltas(tokenizer, s.tools.schemas if s.tools else None,
                        image_token=vision.placeholder if vision is not None else None,
                        verify=s.tokenization_check != "off")
    episodes = []
    for i, task in enumerate(tasks):
        ep = Conversation.begin(f"{id_prefix}-{i}", task, deltas)
        if s.context == WINDOW:
            ep.window = _next_window(ep, s, ep.messages, ep.frame_owner)
        if s.tools is not None:
            s.tools.create(ep.episode_id, task.get("tools_kwargs"))
        if s.interaction is not None:
            s.interaction.start(ep.episode_id, **task.get("interaction_kwargs", {}))
        episodes.append(ep)
    bar = tqdm(total=len(tasks), desc="episodes", unit="ep", disable=not s.progress, leave=False)
    step = 0
    while active := [ep for ep in episodes if not ep.done]:
        for ep in active:
            if _room(ep, s) < 1:
                ep.end(TOKEN_BUDGET)
        active = [ep for ep in active if not ep.done]
        seed = None if sampling.seed is None else sampling.seed + 100_003 * step
        completions = _generate(engine, active, dataclasses.replace(sampling, seed=seed))
        for ep, completion in zip(active, completions):
            reply = completion.token_ids[:_room(ep, s)]
            content = ep.add_reply(reply, completion.logprobs, step)
            if len(reply) < len(completion.token_ids):
                ep.end(TOKEN_BUDGET)  # cut to fit: neither tools nor the user see it
                continue
            follow = _after_reply(ep, content, s)
            if follow is None:
                continue
            messages, images = follow
            delta = deltas.append(messages)
            window = None
            if ep.window is not None:  # the next reply's window must leave room for a reply
                window = _next_window(ep, s, ep.messages + messages, ep.frame_owner
                                      + frame_owners(messages, len(images), len(ep.messages)))
                over = len(window.ids) + len(deltas.closing_ids) >= s.max_tokens
            else:
                over = len(ep.ids) + len(delta) >= s.max_tokens
            if over:
                ep.end(TOKEN_BUDGET)
                continue
            ep.add_messages(messages, delta, images)
            ep.window = window
        bar.n = sum(ep.done for ep in episodes)
        bar.refresh()
        step += 1
    bar.close()
    return [_finish(ep, s) for ep in episodes]


def _generate(engine: Engine, active: list[Conversation], sampling: SamplingParams) -> list:
    """Every active episode's next reply from what it is given (`Conversation.given`); with
    images, each prompt's frames and their starts (only then, so engines without image support
    keep their plain signature)."""
    if not active:
        return []
    prompts, images = zip(*(ep.given() for ep in active))
    if not any(images):
        return engine.generate(list(prompts), sampling)
    return engine.generate(list(prompts), sampling, images=list(images))


def _next_window(ep: Conversation, s: ConversationSettings, messages: list[dict[str, Any]],
                 owners: list[int]):
    """The window of `messages` (the episode's, or with the ones about to be appended)."""
    return render_window(ep.deltas, messages, owners, ep.head, s.history_turns,
                         f"episode {ep.episode_id}")


def _room(ep: Conversation, s: ConversationSettings) -> int:
    """Reply tokens that still fit the token budget after what the model is given, leaving
    space for the turn's closing."""
    return s.max_tokens - len(ep.given()[0]) - len(ep.deltas.closing_ids)
