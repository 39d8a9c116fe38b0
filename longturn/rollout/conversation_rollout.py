"""The built-in conversation rollout (the chat protocol): a batch of tasks played as growing
token sequences, every active episode's next reply generated in one engine call (a lock-step).

After each reply, its tool calls (Hermes format) run through the ToolBox and come back as `tool`
messages (a call that cannot be read, fails or times out is an `Error: …` message: model text
never ends the run); a reply without calls goes to the interaction, which scores it and ends the
episode or answers as the user (without one, the episode ends). A lock-step's calls and answers
run together on the plug-in loop (tasks/plugin_loop.py) and are applied in episode order, so a
record does not depend on which call finished first. An env that fails behind the interaction
aborts that episode alone. The limits, the history window (`history_turns`), image observations
and the closing tokenization check are in docs/conversations.md.

Registered as `longturn.rollout.conversation_rollout:conversation_rollout`;
`rollout.chat.function` may name any function with the same signature and records.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from tqdm.auto import tqdm

from longturn.agent.prompts import ActionPrompt, ActionView
from longturn.engines.base import (Engine, SamplingParams, engine_image_token,
                                   generate_with_frames)
from longturn.engines.row_seeds import episode_turn_seed
from longturn.envs.base import Observation
from longturn.envs.failures import EnvFailure
from longturn.envs.termination import reason_of
from longturn.errors import SettingError
from longturn.rollout.chat_deltas import ChatDeltas
from longturn.rollout.history_window import Joined, WindowPrompt, frame_owners, render_window
from longturn.rollout.conversation import (DONE, MAX_ASSISTANT_TURNS, MAX_USER_TURNS, TIME_LIMIT,
                                       TOKEN_BUDGET, Conversation)
from longturn.tasks.interactions import (BaseInteraction, finalize_all, interaction_of,
                                         action_view as interaction_action_view,
                                         opening as interaction_opening,
                                         read_action as interaction_read_action, respond,
                                         start_all,
                                         succeeded as interaction_succeeded,
                                         truncated as interaction_truncated)
from longturn.tasks.plugin_loop import run_together
from longturn.tasks.verl_api import BaseInteraction as VerlInteraction
from longturn.rollout.tokenization_check import check_tokenization
from longturn.tasks.tool_calls import BadToolCall, ToolCall, parse_tool_calls
from longturn.tasks.tools import ToolBox, ToolResult
from longturn.vision.encoder import IMAGE_PLACEHOLDER

if TYPE_CHECKING:
    from longturn.params.config import ChatParams

log = logging.getLogger(__name__)

@dataclass
class ConversationSettings:
    """Everything a conversation rollout needs besides the engine, tokenizer, sampling and tasks.

    No defaults of its own: `from_config` reads the limits from rollout.chat, the one place
    defaults live; the objects a run loads (tools, interaction, reward) are passed explicitly."""

    max_assistant_turns: int
    max_user_turns: int
    max_tokens: int
    max_tool_response_chars: int
    tool_timeout_s: float | None  # one tool or interaction call, past which it is cut off
    tokenization_check: str
    history_turns: int | None  # the past turns a reply's window shows; None: the whole episode
    # with a window, how an episode whose interaction plays an env (its `action_view`) is shown:
    # as the action protocol's prompt (prompt.*, THINK/ACTION), or (None) as its own messages
    action_prompt: ActionPrompt | None
    # a reply's text as the action parser reads it, without special tokens (an env's episodes in the
    # action protocol: their messages are never rendered again, each reply's prompt is its
    # window); else the template's text of every sampled token, which renders back to its ids
    plain_replies: bool
    tools: ToolBox | None
    # one interaction for every episode, or a file's by name (each task's interaction_kwargs
    # name picks its own: tasks/interactions.py interaction_of)
    interaction: BaseInteraction | VerlInteraction | dict[str, Any] | None
    reward_fn: Callable[[dict[str, Any], list[dict[str, Any]]], float] | None
    progress: bool
    # what the built-in rollout does with an episode whose start failed (an env whose reset
    # failed; its env restarted): try the same task record again, as a group's members share
    # it; or (an evaluation's jobs) return it as `unstarted`, an aborted episode of no reply.
    # The caller's choice, not a setting: `from_config` says retry, an evaluation turns it off.
    retry_failed_starts: bool

    @classmethod
    def from_config(cls, section: ChatParams, *, history_turns: int | None,
                    tools: ToolBox | None,
                    interaction: BaseInteraction | VerlInteraction | dict[str, Any] | None,
                    reward_fn: Callable[[dict[str, Any], list[dict[str, Any]]], float] | None,
                    progress: bool, action_prompt: ActionPrompt | None
                    ) -> ConversationSettings:
        """rollout.chat's limits, the window's turns (`Params.history_window`) and how an env is
        shown in it (prompt.*), plus what the run loaded from its files."""
        if history_turns is not None and history_turns < 1:
            raise SettingError("rollout.context window with prompt.history_turns 0 "
                               "would show no reply and no tool result: set it to 1 or more")
        return cls(max_assistant_turns=section.max_assistant_turns,
                   max_user_turns=section.max_user_turns, max_tokens=section.max_tokens,
                   max_tool_response_chars=section.max_tool_response_chars,
                   tool_timeout_s=section.tool_timeout_s,
                   tokenization_check=section.tokenization_check, history_turns=history_turns,
                   action_prompt=action_prompt, plain_replies=False, tools=tools,
                   interaction=interaction,
                   reward_fn=reward_fn, progress=progress, retry_failed_starts=True)


def _after_tools(ep: Conversation, results: list[ToolResult], s: ConversationSettings
                 ) -> tuple[list[dict[str, Any]], list] | None:
    """A reply's call results, credited to the episode; the tool messages to append and their
    frames (a result's images, each an `<image>` line before its text), or None when the
    episode ended (`max_assistant_turns`)."""
    out, images, limit = [], [], s.max_tool_response_chars
    for result in results:
        ep.tool_calls += 1
        if result.failed:
            ep.tool_errors += 1
            ep.reply_valid[-1] = False
        ep.reward(result.reward, result.metrics)
        text = result.text if len(result.text) <= limit else result.text[:limit] + " …(cut)"
        if result.images:
            text = f"{IMAGE_PLACEHOLDER}\n" * len(result.images) + text
            images += result.images
        out.append({"role": "tool", "name": result.name or "error", "content": text})
    if ep.assistant_turns >= s.max_assistant_turns:
        ep.end(MAX_ASSISTANT_TURNS)
        return None
    return out, images


def _read_calls(content: str) -> list[ToolCall | BadToolCall]:
    """The reply's tool calls. The parser never raises by design; should it ever, the reply is
    one bad call: the model reads an `Error:` message and the episode goes on."""
    try:
        return parse_tool_calls(content)
    except Exception as err:  # model text must not end the run
        log.warning("reading the tool calls of a reply raised", exc_info=True)
        return [BadToolCall(content, f"the tool calls could not be read ({type(err).__name__})")]


async def _run_call(tools: ToolBox, instance_id: str, call: ToolCall | BadToolCall,
                    timeout_s: float, vision: bool) -> ToolResult:
    """One call's result. Whatever the tool box raises becomes an `Error:` result (ToolBox.run
    catches a tool's own faults; this is the last guard, for anything else), and images to a
    model that reads none are one too."""
    name = call.name if isinstance(call, ToolCall) else ""
    try:
        result = await tools.run(instance_id, call, timeout_s)
    except Exception as err:  # a tool's bug must not end the run; it is logged in full
        log.warning("tool call %r raised", name, exc_info=True)
        first_line = (str(err).splitlines() or [""])[0]
        return ToolResult(name, f"Error: the tool call failed: {type(err).__name__}: "
                          f"{first_line}", error="tool_exception")
    if result.images and not vision:
        return ToolResult(name, f"Error: {name} returned an image, and this model reads no "
                          "images", error="bad_result")
    return result


def _user_message(text: str | Observation) -> tuple[dict[str, Any], list]:
    """An interaction's answer as a user message and its frames (an Observation with an image
    gets an `<image>` line before its text)."""
    if not isinstance(text, Observation):
        return {"role": "user", "content": text}, []
    frames = [] if text.image is None else [text.image]
    return {"role": "user", "content": f"{IMAGE_PLACEHOLDER}\n" * len(frames) + text.text}, frames


def _after_replies(replied: list[tuple[Conversation, str]], s: ConversationSettings,
                   vision: bool) -> list[tuple[list[dict], list] | None]:
    """Decide what follows each reply of a lock-step: the messages to append and their frames,
    or None when the episode ended. Every episode's tool calls, and every interaction answer,
    run at once (the tools' and the interaction's waits overlap); their results are applied
    episode by episode in order, so records do not depend on which call finished first."""
    calls = [_read_calls(content) if s.tools is not None else [] for _, content in replied]
    jobs = [lambda e=ep.episode_id, c=call: _run_call(s.tools, e, c, s.tool_timeout_s, vision)
            for (ep, _), found in zip(replied, calls) for call in found]
    asking = [ep for (ep, _), found in zip(replied, calls)
              if not found and s.interaction is not None]
    jobs += [lambda ep=ep: _answer(_partner(s, ep), ep, s.tool_timeout_s) for ep in asking]
    done = run_together(jobs)  # the calls' results, then the answers
    results, answers = iter(done), iter(done[len(done) - len(asking):])
    return [_after_tools(ep, [next(results) for _ in found], s) if found
            else _after_text(ep, next(answers, None), s) for (ep, _), found in zip(replied, calls)]


@dataclass(frozen=True)
class _EnvFailed:
    """An interaction's answer that is the failure of the env behind it (not raised: one
    episode's failure must not end the lock-step's other calls)."""

    reason: str


async def _answer(partner: Any, ep: Conversation, timeout_s: float) -> tuple | _EnvFailed:
    """The interaction's answer to the episode's reply, or the failure of an env behind it
    (tasks/env_frames.py), which aborts this episode alone."""
    try:
        return await respond(partner, ep.episode_id, ep.messages,
                             ep.task.get("interaction_kwargs", {}), timeout_s)
    except EnvFailure as failure:
        return _EnvFailed(failure.reason)


def _after_text(ep: Conversation, answer: tuple | None, s: ConversationSettings
                ) -> tuple[list[dict], list] | None:
    """A reply without tool calls: the interaction's `answer` (should_terminate, text, score,
    metrics), or without an interaction the end of the episode."""
    if s.interaction is None:
        if s.reward_fn is not None:
            ep.reward(s.reward_fn(ep.task, ep.messages))
        ep.end(DONE)
        return None
    if isinstance(answer, _EnvFailed):  # the step of this reply's action failed: it alone
        ep.abort(answer.reason, last_reply_only=True)  # is out of the loss
        return None
    stop, text, score, metrics = answer
    ep.reward(0.0 if score is None else score, metrics)  # verl allows a turn without a score
    parsed = interaction_read_action(_partner(s, ep), ep.episode_id)
    if parsed is not None:
        ep.read_as_action(parsed, (metrics or {}).get("env_reward"))
    if stop:
        ep.end(TIME_LIMIT if interaction_truncated(_partner(s, ep), ep.episode_id) else DONE)
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


def _finish(ep: Conversation, s: ConversationSettings, tool_rewards: dict[str, float],
            first: int) -> dict[str, Any]:
    """Credit the tools' episode rewards, run the check; in a window, keep the window a next
    reply would have seen when the episode was cut short (its bootstrap). The record of the
    replies from `first` on (`Conversation.record`), with `success` when the interaction says
    (an env's), else None: the task decides (ConversationRun.succeeded). An env's episode that
    ended on its own is named by envs/termination.py (success, failure, time_limit)."""
    if ep.windows:  # an aborted episode trains on nothing: no bootstrap
        ep.window = (None if ep.reason == DONE or ep.aborted
                     else _next_window(ep, s, ep.messages, ep.frame_owner))
    if ep.segments:  # no reply fitted: nothing to credit
        for name, value in tool_rewards.items():
            if value:
                ep.reward(value, {f"{name}_reward": value})
    # the sequence ends with a reply's closing, or (no reply fitted) the generation prompt
    ep.check = check_tokenization(ep.deltas, ep.messages, ep.ids, s.tokenization_check,
                                  add_generation_prompt=not ep.segments,
                                  where=f"episode {ep.episode_id}").outcome
    said = (interaction_succeeded(_partner(s, ep), ep.episode_id) if s.interaction is not None
            else None)
    record = {**ep.record(first), "success": said}
    if said is not None and ep.reason in (DONE, TIME_LIMIT):  # an env's: the env's words
        record["termination"] = reason_of({"success": said, "terminated": ep.reason == DONE,
                                           "truncated": ep.reason == TIME_LIMIT})
    return record


def finish_all(episodes: list[Conversation], s: ConversationSettings,
               firsts: list[int] | None = None) -> list[dict[str, Any]]:
    """Every episode's record (of its replies from `firsts[i]` on; None: all); the tools'
    episode rewards are asked for all at once, and tools and interaction release every episode
    (all at once) even when a check fails."""
    ids = [ep.episode_id for ep in episodes]
    try:
        rewards = (s.tools.rewards_many(ids, s.tool_timeout_s) if s.tools is not None
                   else [{} for _ in episodes])
        return [_finish(ep, s, r, first)
                for ep, r, first in zip(episodes, rewards, firsts or [0] * len(episodes))]
    finally:
        release_all(episodes, s)


def release_all(episodes: list[Conversation], s: ConversationSettings) -> None:
    """Tools and interaction let go of these episodes, all at once (finished or abandoned)."""
    release_opened([ep.task for ep in episodes], [ep.episode_id for ep in episodes], s)


def release_opened(tasks: list[dict[str, Any]], ids: list[str], s: ConversationSettings) -> None:
    """Tools and interaction let go of the episodes of these task records (begun or not), all
    at once."""
    if s.tools is not None:
        s.tools.release_many(ids, s.tool_timeout_s)
    if s.interaction is not None:
        finalize_all([(interaction_of(s.interaction, task, i), i) for task, i in zip(tasks, ids)],
                     s.tool_timeout_s)


def keep_running(episodes: list[Conversation], s: ConversationSettings) -> bytes | str:
    """Running episodes with their tools' and interaction's state (`episode_state`), pickled
    for a checkpoint; or why they cannot be kept (a plug-in without `episode_state`, a state
    that does not pickle)."""
    partners = [_partner(s, ep) for ep in episodes] if s.interaction is not None else []
    why = s.tools.cannot_keep() if s.tools is not None else None
    why = why or next((f"interaction {p.name!r} has no episode_state" for p in partners
                       if not hasattr(p, "episode_state")), None)
    if why is not None:
        return why
    ids = [ep.episode_id for ep in episodes]
    try:
        return pickle.dumps((episodes, s.tools.episode_states(ids) if s.tools else None,
                             [p.episode_state(e) for p, e in zip(partners, ids)]))
    except (pickle.PicklingError, TypeError, AttributeError) as err:
        return f"their state does not pickle ({type(err).__name__}: {err})"


def resume_running(kept: bytes, s: ConversationSettings) -> list[Conversation]:
    """The episodes `keep_running` kept, running again in this run's tools and interaction
    (their template deltas are set again at the next lock-step)."""
    episodes, tool_states, partner_states = pickle.loads(kept)
    if s.tools is not None and tool_states is not None:
        s.tools.restore_episodes([ep.episode_id for ep in episodes], tool_states)
    for ep, state in zip(episodes, partner_states):
        _partner(s, ep).restore_episode(ep.episode_id, state)
    return episodes


def conversation_rollout(engine: Engine, tokenizer: Any, sampling: SamplingParams,
                     tasks: list[dict[str, Any]], settings: ConversationSettings,
                     id_prefix: str = "seq") -> list[dict[str, Any]]:
    """Play every task to its end; one record per task, in task order. An episode whose start
    failed and was tried again has the reasons in `failed_starts`; without
    `settings.retry_failed_starts` it is an `unstarted` record."""
    ids = [f"{id_prefix}-{i}" for i in range(len(tasks))]
    retry = settings.retry_failed_starts
    episodes, failures = start_episodes(chat_deltas(engine, tokenizer, settings), tasks, ids,
                                        settings, retry)
    bar = tqdm(total=len(episodes), desc="episodes", unit="ep", disable=not settings.progress,
               leave=False)
    step = 0
    while any(not ep.done for ep in episodes):
        seed = None if sampling.seed is None else sampling.seed + 100_003 * step
        lock_step(engine, episodes, settings, dataclasses.replace(sampling, seed=seed), step)
        bar.n = sum(ep.done for ep in episodes)
        bar.refresh()
        step += 1
    bar.close()
    finished = iter(finish_all(episodes, settings))
    records = [next(finished) if retry or not why else _unstarted_record(tasks[k], ids[k], why[0])
               for k, why in enumerate(failures)]
    for record, reasons in zip(records, failures):
        if reasons and retry:
            record["failed_starts"] = reasons
    return records


def _unstarted_record(task: dict[str, Any], episode_id: str, reason: str) -> dict[str, Any]:
    """The record of an episode whose start failed for `reason` (env_error or timeout): aborted,
    no token, no reply."""
    return {"episode_id": episode_id, "task": task.get("task", ""),
            "episode_seed": int(task.get("seed", 0)), "input_ids": [], "loss_mask": [],
            "engine_logprobs": [], "segment_starts": [], "segment_ends": [],
            "segment_rewards": [], "reply_finish_reasons": [], "reply_valid": [],
            "reply_actions": [], "reward": 0.0, "termination": reason, "truncated": False,
            "aborted": True, "unstarted": True, "images": None, "image_starts": None,
            "messages": "[]", "success": False, "env_name": task.get("env_name")}


def chat_deltas(engine: Engine, tokenizer: Any, s: ConversationSettings) -> ChatDeltas:
    """The template deltas every episode of a rollout shares (with the engine's image token)."""
    return ChatDeltas(tokenizer, s.tools.schemas if s.tools else None,
                      image_token=engine_image_token(engine),
                      verify=s.tokenization_check != "off")


def start_episodes(deltas: ChatDeltas, tasks: list[dict[str, Any]], ids: list[str],
                   settings: ConversationSettings, retry: bool = True
                   ) -> tuple[list[Conversation], list[list[str]]]:
    """New episodes of these task records, played whole: opened (`open_episodes`; with `retry`
    a start that failed is tried again on the same task, the env behind it restarted, until the
    interaction gives up, else that episode is left out), then begun. Also, per task record,
    why each of its failed starts failed."""
    opened: list[dict[str, Any] | str] = [""] * len(tasks)
    failures: list[list[str]] = [[] for _ in tasks]
    todo = list(range(len(tasks)))
    while todo:
        again = open_episodes([tasks[k] for k in todo], [ids[k] for k in todo], settings)
        for k, outcome in zip(todo, again):
            opened[k] = outcome
            if isinstance(outcome, str):
                failures[k].append(outcome)
        todo = [k for k in todo if isinstance(opened[k], str)] if retry else []
    began = [k for k, outcome in enumerate(opened) if not isinstance(outcome, str)]
    return begin_episodes(deltas, [opened[k] for k in began],  # type: ignore[misc]
                          [ids[k] for k in began], settings), failures


def open_episodes(tasks: list[dict[str, Any]], ids: list[str],
                  settings: ConversationSettings) -> list[dict[str, Any] | str]:
    """Start every episode's tools and interaction, all at once. Per episode its task record as
    the model will first see it (with the messages its interaction opened it with: `opening`,
    an env's instructions and first observation from the env it has just reset), or why its
    start failed (an env that failed to reset; the interaction restarted it, and this episode's
    tools and interaction are released)."""
    s = settings
    # each episode's interaction picked (a wrong name stops here, before any tool instance)
    partners = ([interaction_of(s.interaction, task, i) for task, i in zip(tasks, ids)]
                if s.interaction is not None else [])
    if s.tools is not None:
        s.tools.create_many([(i, task.get("tools_kwargs")) for i, task in zip(ids, tasks)],
                            s.tool_timeout_s)
    try:
        failed = (start_all([(p, i, task.get("interaction_kwargs", {}))
                             for p, i, task in zip(partners, ids, tasks)], s.tool_timeout_s)
                  if partners else [None] * len(tasks))
        out = [why if why is not None else _opened(
                   task, interaction_opening(partners[k], i) if partners else None, i)
               for k, (task, i, why) in enumerate(zip(tasks, ids, failed))]
    except BaseException:
        release_opened(tasks, ids, s)
        raise
    lost = [k for k, outcome in enumerate(out) if isinstance(outcome, str)]
    if lost:
        release_opened([tasks[k] for k in lost], [ids[k] for k in lost], s)
    return out


def begin_episodes(deltas: ChatDeltas, opened: list[dict[str, Any]], ids: list[str],
                   settings: ConversationSettings) -> list[Conversation]:
    """The conversations of these opened episodes (`open_episodes`), rendered; if rendering
    fails (a model without an image side…), their tools and interaction are released."""
    s = settings
    episodes = []
    try:
        for episode_id, task in zip(ids, opened):
            ep = Conversation.begin(episode_id, task, deltas)
            if s.history_turns is not None:
                ep.window = _next_window(ep, s, ep.messages, ep.frame_owner)
            episodes.append(ep)
    except BaseException:
        release_opened(opened, ids, s)
        raise
    return episodes


def _opened(task: dict[str, Any], opening: tuple[list[dict], list] | None,
            episode_id: str) -> dict[str, Any]:
    """The task record with the messages (and frames) its interaction opened the episode with."""
    if opening is not None:
        messages, images = opening
        task = {**task, "messages": [*task["messages"], *messages],
                "images": [*(task.get("images") or []), *images]}
    if not task["messages"]:
        raise SettingError(f"episode {episode_id}: task {task.get('task', '?')!r} gave no "
                           "messages and no interaction opened the episode (an env task needs "
                           "its interaction: configs/env_interactions.yaml)")
    return task


def _partner(s: ConversationSettings, ep: Conversation) -> Any:
    """The interaction this episode talks to (the run's one, or its task's by name)."""
    return interaction_of(s.interaction, ep.task, ep.episode_id)


def lock_step(engine: Engine, episodes: list[Conversation], settings: ConversationSettings,
              sampling: SamplingParams, step: int, keyed_seed: int | None = None) -> None:
    """One reply for each episode that has not ended, in one engine call, and what follows it
    (tool results, the interaction's answer, the end). `sampling` is seeded for this lock-step
    by the caller, or (`keyed_seed`) each reply by its episode's id and turn under that seed
    (`episode_turn_seed`); `step` is the replies' lock-step."""
    s = settings
    active = [ep for ep in episodes if not ep.done]
    for ep in active:
        if _room(ep, s) < 1:
            ep.end(TOKEN_BUDGET)
    active = [ep for ep in active if not ep.done]
    if keyed_seed is not None:
        sampling = dataclasses.replace(sampling, seed=tuple(
            episode_turn_seed(keyed_seed, ep.episode_id, len(ep.segments)) for ep in active))
    completions = _generate(engine, active, sampling)
    replied = []
    for ep, completion in zip(active, completions):
        reply = completion.token_ids[:_room(ep, s)]
        cut = len(reply) < len(completion.token_ids)  # to fit the budget: it ran out of room
        content = ep.add_reply(reply, completion.logprobs, step,
                               "length" if cut else completion.finish_reason, s.plain_replies)
        if cut:
            ep.end(TOKEN_BUDGET)  # cut to fit: neither tools nor the user see it
            continue
        replied.append((ep, content))
    vision = engine_image_token(engine) is not None
    for (ep, _), follow in zip(replied, _after_replies(replied, s, vision)):
        if follow is None:
            continue
        messages, images = follow
        delta = ep.deltas.append(messages)
        window = None
        if ep.window is not None:  # the next reply's window must leave room for a reply
            window = _next_window(ep, s, Joined(ep.messages, messages), Joined(
                ep.frame_owner, frame_owners(messages, len(images), len(ep.messages))))
            over = len(window.ids) + len(ep.deltas.closing_ids) >= s.max_tokens
        else:
            over = len(ep.ids) + len(delta) >= s.max_tokens
        if over:
            ep.end(TOKEN_BUDGET)
            continue
        ep.add_messages(messages, delta, images)
        ep.window = window


def _generate(engine: Engine, active: list[Conversation], sampling: SamplingParams) -> list:
    """Every active episode's next reply from what it is given (`Conversation.given`); with
    images, each prompt's frames and their starts (only then, so engines without image support
    keep their plain signature)."""
    if not active:
        return []
    prompts, images = zip(*(ep.given() for ep in active))
    return generate_with_frames(engine, list(prompts), list(images), sampling)


def _next_window(ep: Conversation, s: ConversationSettings,
                 messages: Sequence[dict[str, Any]], owners: Sequence[int]) -> WindowPrompt:
    """The window of `messages` (the episode's, or with the ones about to be appended); an
    episode of an env shown as the action protocol shows it, its interaction's `action_view`
    (`_action_window`)."""
    view = (interaction_action_view(_partner(s, ep), ep.episode_id)
            if s.action_prompt is not None and s.interaction is not None else None)
    if view is not None:
        return _action_window(ep, s.action_prompt, s.history_turns, view, owners)
    return render_window(ep.deltas, messages, owners, ep.head, s.history_turns,
                         f"episode {ep.episode_id}")


def _action_window(ep: Conversation, shown: ActionPrompt, turns: int | None, view: ActionView,
                   owners: Sequence[int]) -> WindowPrompt:
    """The action protocol's prompt of the episode's next reply: its env's instructions, its last
    `turns` steps as prompt.* shows them (the oldest dropped to fit prompt.max_prompt_tokens),
    the current observation and its frame only. That frame is the episode's newest, once its
    observation is appended; an ended episode's last observation never is, so its frame is
    kept for the bootstrap here."""
    prompt = shown.render(ep.deltas.tokenizer, view, turns, ep.deltas.image_token)
    said = {"text": prompt.text, "history_dropped": prompt.history_dropped,
            "observation": view.observation}
    if view.frame is None:
        return WindowPrompt(prompt.ids, [], [], **said)
    if ep.done and (not ep.images or ep.images[-1] is not view.frame):
        ep.keep_frame(view.frame)
        owners = ep.frame_owner
    return WindowPrompt(prompt.ids, [len(owners) - 1], prompt.image_starts, **said)


def _room(ep: Conversation, s: ConversationSettings) -> int:
    """Reply tokens that still fit the token budget after what the model is given, leaving
    space for the turn's closing."""
    given = len(ep.ids) if ep.window is None else len(ep.window.ids)
    return s.max_tokens - given - len(ep.deltas.closing_ids)
