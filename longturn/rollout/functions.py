"""`rollout.chat.function`: the rollout of the chat protocol named by import path, as slime does it.

A rollout function is called as `fn(engine, tokenizer, sampling, tasks, settings)` (the engine,
its tokenizer, the SamplingParams, a batch of task records, a ConversationSettings) and returns one
record per task with the columns of a conversation record (`Conversation.record`). The built-in
one is registered the same way: `longturn.rollout.conversation_rollout:conversation_rollout`.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from longturn.errors import SettingError
from longturn.tasks.plugins import import_class

BUILTIN = "longturn.rollout.conversation_rollout:conversation_rollout"
AGENT_ROLLOUT = "longturn.serve.agent_rollout:agent_rollout"  # rollout.agent's (bound to it)
_ARGS = ("engine", "tokenizer", "sampling", "tasks", "settings")


def resolve_rollout_function(path: str = BUILTIN) -> Callable[..., list[dict[str, Any]]]:
    """The function at `package.module:function`, checked to take the five rollout arguments."""
    fn = import_class(path, f"rollout.chat.function {path!r}")
    if not callable(fn):
        raise SettingError(f"rollout.chat.function {path!r} is not callable")
    try:
        inspect.signature(fn).bind(*_ARGS)
    except TypeError as err:
        raise SettingError(f"rollout.chat.function {path!r} must take ({', '.join(_ARGS)}): "
                           f"{err}") from None
    except ValueError:
        pass  # a builtin without a signature: trust it
    return fn
