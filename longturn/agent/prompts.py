"""Chat prompts for one turn: instructions, the history window, the current observation.

The prompt is rendered with the model's own chat template. When it exceeds the token budget the
oldest history turns are dropped first (and the caller is told how many); if the current turn alone
does not fit, `PromptTooLong` is raised. A prompt is never cut in the middle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from longturn.agent.token_cache import expand_image_tokens, token_ids
from longturn.agent.memory import HistoryEntry, PastTurn
from longturn.instructions import Instructions
from longturn.errors import UserError
from longturn.vision.encoder import IMAGE_PLACEHOLDER

if TYPE_CHECKING:
    from longturn.params.config import PromptParams

EMPTY_VIEW = "(nothing noteworthy in view)"


class PromptTooLong(UserError, ValueError):
    """The current observation with the instructions does not fit `max_prompt_tokens`."""


@dataclass(frozen=True)
class Prompt:
    """A rendered prompt: token ids for the engine, text for people, what history it kept."""

    ids: list[int]
    text: str
    history_used: int
    history_dropped: int
    frames: list[Any] = field(default_factory=list)  # the current observation's image, if any
    image_starts: list[int] = field(default_factory=list)  # where its placeholder run begins


def system_prompt(instructions: Instructions) -> str:
    """Actions with descriptions and tips. The goal is not here but in each current turn, so the
    system prompt and the worked examples form a prefix shared by every prompt of the env family
    (engines compute it once per batch)."""
    actions = ",\n".join(f"{name}: {desc}" for name, desc in instructions.actions.items())
    parts = [
        "You are an agent in a text game. Each turn you are given your goal and what you "
        "observe. These are the actions you can take, each with a short description:",
        actions + ".",
        "After each action you receive an observation describing what you see.",
    ]
    if instructions.tips:
        parts.append("Tips:\n" + "\n".join(f"- {tip}" for tip in instructions.tips))
    parts.append("PLAY!")
    return "\n\n".join(parts)


def _view(text: str) -> str:
    return text if text.strip() else EMPTY_VIEW


def current_turn(instructions: Instructions, goal: str, observation: str) -> str:
    """The user turn of the current observation: the goal, the view, the THINK/ACTION answer
    format."""
    return (f"Your goal: {goal}.\nCurrent observation:\n{_view(observation)}\n\n"
            "Answer in exactly this format:\n"
            "THINK: <one short sentence of reasoning>\n"
            f"ACTION: <exactly one of: {', '.join(instructions.actions)}>")


def build_messages(
    instructions: Instructions, history: list[HistoryEntry], observation: str,
    demonstration: bool = True,
) -> list[dict[str, str]]:
    """System, the env's worked examples (if any and wanted), past observations / replies, then the
    goal and current observation with the answer format."""
    messages = [{"role": "system", "content": system_prompt(instructions)}]
    # each worked turn is shown exactly as a real one, answer format included: with the format on
    # the last one only, SmolLM2-135M said `turn left` on 55% of zero-shot goto turns
    for demo_goal, demo_obs, demo_reply in instructions.demonstrations if demonstration else ():
        messages.append({"role": "user",
                         "content": current_turn(instructions, demo_goal, demo_obs)})
        messages.append({"role": "assistant", "content": demo_reply})
    for entry in history:
        messages.append({"role": "user", "content": "Observation:\n" + _view(entry.observation)})
        messages.append({"role": "assistant", "content": entry.reply})
    messages.append({"role": "user",
                     "content": current_turn(instructions, instructions.goal, observation)})
    return messages


def history_reply(
    output: str, action: str, valid: bool,
    content: Literal["output", "action"], invalid: Literal["default_action", "raw_output"],
) -> str:
    """What the model sees of its own past turn: its output, or just the action it executed."""
    if content == "action" or (not valid and invalid == "default_action"):
        return f"ACTION: {action}"
    return output


def render(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[str, list[int]]:
    """Chat-template text (with the assistant header) and its token ids."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return text, token_ids(tokenizer, text)


def build_prompt(
    tokenizer: Any, instructions: Instructions, history: list[HistoryEntry],
    observation: str, max_prompt_tokens: int, demonstration: bool = True,
    frame: Any = None, image_token: tuple[int, int] | None = None,
) -> Prompt:
    """Render within budget, dropping the oldest history turns first. With a `frame` (the
    current observation's image) the observation begins with an `<image>` line, expanded to the
    feature positions of `image_token` (a vision-language model's (id, tokens per image)) and
    counted in the budget; past observations stay text."""
    if frame is not None:
        if image_token is None:
            raise UserError("the env gives image observations but the model has no image side "
                            "(its model dir has no vision/; docs/image-observations.md)")
        observation = f"{IMAGE_PLACEHOLDER}\n{observation}"
    for dropped in range(len(history) + 1):
        kept = history[dropped:]
        messages = build_messages(instructions, kept, observation, demonstration)
        text, ids = render(tokenizer, messages)
        if frame is not None:
            ids = expand_image_tokens(ids, image_token)
        if len(ids) <= max_prompt_tokens:
            if frame is None:
                return Prompt(ids, text, len(kept), dropped)
            return Prompt(ids, text, len(kept), dropped, [frame], [ids.index(image_token[0])])
    raise PromptTooLong(
        f"the prompt for the current observation alone is {len(ids)} tokens, over "
        f"prompt.max_prompt_tokens={max_prompt_tokens}; raise the budget or shorten the instructions"
    )


@dataclass(frozen=True)
class ActionView:
    """What an action prompt of the next reply is built from (the env interaction behind a
    conversation gives it: `action_view`): the env's instructions, its past steps of this
    episode (oldest first), the current observation and its frame."""

    instructions: Instructions
    past: Sequence[PastTurn]
    observation: str
    frame: Any = None


@dataclass(frozen=True)
class ActionPrompt:
    """How an action prompt shows the past (prompt.*): the action protocol's, or a chat
    conversation of an env with a history window, so the same step reads the same.
    No defaults of its own: the prompt section's are the ones (`from_config`)."""

    history_content: Literal["output", "action"]
    invalid_in_history: Literal["default_action", "raw_output"]
    max_prompt_tokens: int
    demonstration: bool

    @classmethod
    def from_config(cls, section: PromptParams) -> "ActionPrompt":
        return cls(history_content=section.history_content,
                   invalid_in_history=section.invalid_in_history,
                   max_prompt_tokens=section.max_prompt_tokens,
                   demonstration=section.demonstration)

    def render(self, tokenizer: Any, view: ActionView, turns: int | None,
               image_token: tuple[int, int] | None = None) -> Prompt:
        """The prompt of `view` with its last `turns` past steps (None: all of them), the
        oldest dropped first to fit `max_prompt_tokens` (`build_prompt`)."""
        past = list(view.past)
        past = past if turns is None else past[max(0, len(past) - turns):]
        history = [HistoryEntry(t.observation, history_reply(
            t.reply, t.action, t.valid, self.history_content, self.invalid_in_history))
            for t in past]
        return build_prompt(tokenizer, view.instructions, history, view.observation,
                            self.max_prompt_tokens, self.demonstration, view.frame, image_token)
