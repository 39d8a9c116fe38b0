"""Chat messages as token deltas of the chat template, so earlier tokens are never re-tokenized.

Why: re-tokenizing the whole conversation after each turn can split the model's own output into
other tokens than it sampled (and a template may rewrite earlier turns), so the ids trained on
would not be the ids generated. Instead the sequence only ever grows:
- the first messages are rendered once, with the generation prompt;
- the model's reply is appended as the exact sampled ids;
- the template's closing of an assistant turn (the end-of-turn text the model did not sample, and
  what follows it, `\\n` in ChatML) is appended after the reply;
- later messages (tool results, user turns) are rendered after a fixed dummy conversation that
  ends with an assistant turn, and only the text past that dummy is tokenized. The dummy keeps a
  system or tool preamble from being rendered again.

Images: a message writes `<image>` where an image goes; with a vision-language model the image
token is expanded to the number of feature positions its image fills (`encode`).

Tools: schemas go to the template's `tools=`. A template that ignores them (SmolLM2's) gets the
schemas written into the system message in the Hermes format instead (`tool_preamble`), so the
model is told about its tools either way; `prepare` applies that to the message list, and the
sanity check re-renders the same list.

A template that renders differently on each call (a date line): the delta is cut right after the
dummy's assistant turn, found by its content, so a changing preamble does not matter; only
`verify` (the tokenization check on) compares the prefix with its first render, and a failure
tells a changing template (`template_drift`) from one that rewrites earlier turns.
"""

from __future__ import annotations

import json
from typing import Any

from longturn.agent.token_cache import expand_image_tokens, token_ids
from longturn.errors import UserError
from longturn.rollout.template_drift import render_difference, unstable_template_message

_MARK = "\u2063longturn-reply\u2063"  # content no template rewrites, to find an assistant's closing
# A conversation the template renders before any new message; its text is cut off again, right
# after the assistant turn whose content is the mark.
_DUMMY = [{"role": "system", "content": "dummy system"},
          {"role": "user", "content": "dummy user"},
          {"role": "assistant", "content": _MARK}]


class ChatTemplateError(UserError):
    """The chat template renders in a way deltas cannot follow (it rewrites the dummy prefix)."""


def tool_preamble(tools: list[dict[str, Any]]) -> str:
    """The Hermes-format tool description for templates without native tool support."""
    lines = "\n".join(json.dumps(tool, sort_keys=True) for tool in tools)
    return ("# Tools\n\nYou may call one or more of these functions. Their signatures are inside "
            f"<tools></tools>:\n<tools>\n{lines}\n</tools>\n\nTo call one, write a JSON object "
            "with its name and arguments between tags, one call per pair:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


class ChatDeltas:
    """Renders a tokenizer's chat template as deltas; holds no per-episode state."""

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]] | None = None,
                 template_kwargs: dict[str, Any] | None = None,
                 image_token: tuple[int, int] | None = None, verify: bool = True):
        """`image_token`: (id, tokens per image) of a vision-language model, whose every image
        token stands for that many feature positions (`vision.encoder`). `verify`: compare each
        delta's prefix with the dummy's first render (off with `rollout.tokenization_check:
        off`, so nothing is re-rendered for checking)."""
        self.tokenizer = tokenizer
        self.image_token = image_token
        self.verify = verify
        self.tools = list(tools or [])
        self.template_kwargs = dict(template_kwargs or {})
        self.native_tools = self._takes_tools()
        self._dummy_text = self.render(_DUMMY, add_generation_prompt=False)
        self.assistant_closing = self._closing()
        self.closing_ids = self.encode(self.assistant_closing)
        if not self.closing_ids:
            raise ChatTemplateError("the chat template closes an assistant message with nothing; "
                                    "the chat protocol needs an end-of-turn token")

    # ------------------------------------------------------------------ rendering

    def _takes_tools(self) -> bool:
        """Whether the template writes `tools=` itself: a tool's name shows up in the rendering
        only when given (by name, so a template that changes on each call is not mistaken)."""
        if not self.tools:
            return False
        probe = [{"role": "user", "content": "probe"}]
        given, without = self._render(probe, False, self.tools), self._render(probe, False, None)
        names = [(t.get("function") or t).get("name") for t in self.tools]
        return any(isinstance(n, str) and n in given and n not in without for n in names)

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
                tools: list[dict[str, Any]] | None) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False,
            add_generation_prompt=add_generation_prompt, **self.template_kwargs)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        """The template's text for `messages` (already `prepare`d)."""
        return self._render(messages, add_generation_prompt,
                            self.tools if self.native_tools else None)

    def encode(self, text: str, cached: bool = True) -> list[int]:
        """Token ids of template text; each image token expanded to its feature positions, as a
        LLaVA processor does, so deltas and the full re-tokenization agree. Through the piece
        cache (agent/token_cache.py): a window renders the task's messages again for every
        reply, and their pieces are tokenized once. `cached=False`: the tokenizer on the whole
        text (the tokenization check's independent reference)."""
        ids = (token_ids(self.tokenizer, text) if cached
               else list(self.tokenizer.encode(text, add_special_tokens=False)))
        return expand_image_tokens(ids, self.image_token)

    def decode(self, ids: list[int]) -> str:
        """Text of ids, each expanded image written once (`<image>`), as the template has it."""
        return self.tokenizer.decode(self._collapse_images(ids), skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)

    def image_starts(self, ids: list[int], count: int, where: str) -> list[int]:
        """Where each of `count` images' placeholder runs begins in `ids` (ids this template
        rendered); placeholders and images must match one to one, in order."""
        if self.image_token is None:
            if count:
                raise UserError(f"{where}: the task gives image observations but the model has "
                                "no image side (its model dir has no vision/; "
                                "docs/image-observations.md)")
            return []
        image_id, width = self.image_token
        at = [i for i, t in enumerate(ids) if t == image_id]
        starts = at[::width]
        if len(at) != width * count or any(at[k * width + width - 1] != s + width - 1
                                           for k, s in enumerate(starts)):
            raise UserError(f"{where}: {count} image(s) for {len(at) / width:g} <image> "
                            "placeholder(s) in the messages")
        return starts

    def _collapse_images(self, ids: list[int]) -> list[int]:
        if self.image_token is None:
            return list(ids)
        image_id, width = self.image_token
        out, run = [], 0
        for token in ids:
            run = run + 1 if token == image_id else 0
            if run and (run - 1) % width:  # inside an image's run: its first token stands for it
                continue
            out.append(token)
        return out

    def prepare(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The first messages of an episode, with the tool preamble in the system message when
        the template does not take `tools=` itself."""
        messages = [dict(m) for m in messages]
        if not self.tools or self.native_tools:
            return messages
        preamble = tool_preamble(self.tools)
        if messages and messages[0]["role"] == "system":
            messages[0]["content"] = f"{messages[0]['content']}\n\n{preamble}"
        else:
            messages.insert(0, {"role": "system", "content": preamble})
        return messages

    def _closing(self) -> str:
        """What the template writes after an assistant's content (`<|im_end|>\\n` in ChatML)."""
        at = self._dummy_text.rfind(_MARK)
        if at < 0:
            raise ChatTemplateError("the chat template drops the assistant's content; the chat "
                                    "protocol needs a template that renders assistant messages")
        return self._dummy_text[at + len(_MARK):]

    def check_stable(self) -> None:
        """Raise when a fresh render of the dummy conversation differs from its first render:
        the template renders differently on each call, which no delta can be blamed for."""
        difference = render_difference(self._dummy_text, self.render(_DUMMY, False))
        if difference:
            raise ChatTemplateError(unstable_template_message(difference))

    # ------------------------------------------------------------------ token ids

    def start(self, messages: list[dict[str, Any]]) -> list[int]:
        """Ids of an episode's first (prepared) messages, ending with the generation prompt."""
        return self.encode(self.render(messages, add_generation_prompt=True))

    def close_reply(self, reply_ids: list[int]) -> list[int]:
        """Ids that close a sampled reply the way the template closes an assistant message: the
        rest of the closing after the end-of-turn token when the model sampled it, all of it when
        the reply was cut at max_new_tokens or ended with another stop token."""
        if reply_ids and reply_ids[-1] == self.closing_ids[0]:
            return self.closing_ids[1:]
        return list(self.closing_ids)

    def append(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
               ) -> list[int]:
        """Ids of `messages` rendered after a closed assistant turn, with the generation prompt
        for the next reply unless the episode ends here."""
        text = self.render(_DUMMY + list(messages), add_generation_prompt)
        at = text.find(_MARK)
        cut = at + len(_MARK) + len(self.assistant_closing)
        misplaced = at < 0 or text[at + len(_MARK):cut] != self.assistant_closing
        if misplaced or (self.verify and text[:cut] != self._dummy_text):
            if self.verify:
                self.check_stable()  # a changing template is not one that rewrites turns
            raise ChatTemplateError(
                "the chat template renders earlier messages differently once more follow, so "
                "deltas cannot be cut from it (the dummy conversation and its rendering before "
                f"more messages differ {render_difference(self._dummy_text, text[:cut])}); use "
                "rollout.tokenization_check to compare, or a template that leaves earlier turns "
                "alone")
        return self.encode(text[cut:])

    def reply_content(self, reply_ids: list[int]) -> str:
        """The assistant message content of a sampled reply: its text without a sampled
        end-of-turn token (the template writes that itself)."""
        if reply_ids and reply_ids[-1] == self.closing_ids[0]:
            reply_ids = reply_ids[:-1]
        return self.decode(reply_ids)
