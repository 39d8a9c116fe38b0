"""What an env failure looks like to the rollout: one episode lost, or (repeated) the stage stopped.

`EnvFailure` is one reset or step that raised, crashed its worker or hung past
`env.step_timeout_s`: the rollout aborts that episode, restarts the env and goes on. `EnvGaveUp` is
more than `env.max_retries` failures of one env in a row: a deterministically broken env must
stop the stage with one line rather than loop forever.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

from longturn.envs.termination import ENV_ERROR
from longturn.errors import UserError

log = logging.getLogger(__name__)


class EnvFailure(Exception):
    """One env call that failed; `reason` is a termination reason (env_error or timeout)."""

    def __init__(self, reason: str, message: str, details: str = ""):
        super().__init__(message)
        self.reason, self.message, self.details = reason, message, details

    @classmethod
    def from_exception(cls, err: BaseException) -> "EnvFailure":
        """An exception raised by env code, with its traceback kept for the log."""
        details = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        return cls(ENV_ERROR, f"{type(err).__name__}: {err}", details)


class EnvGaveUp(UserError):
    """An env (an env interaction's) failed more than its max_retries times in a row."""


def restart_or_give_up(env: Any, failure: EnvFailure, *, name: str, task: str, call: str,
                       seed: int, failures: int, limit: int, setting: str,
                       turn: int | None = None) -> None:
    """After a failed `call` (reset or step) of `env`, the `failures`-th in a row: log it
    (its episode is aborted) and restart the env, or past `limit` stop the stage with one line
    naming the env, the last failure and `setting`, the one that allows more. Env slots and the
    chat protocol's env interaction both go through here."""
    at = f"seed {seed}" if turn is None else f"seed {seed} turn {turn}"
    log.warning("env %s/%s %s failed (%s) on %s, episode aborted: %s%s", name, task, call,
                failure.reason, at, failure.message,
                "\n" + failure.details if failure.details else "")
    if failures > limit:
        message = " ".join(failure.message.split())
        raise EnvGaveUp(f"env {name!r} task {task!r} failed {failures} times in a row, the last "
                        f"on seed {seed} ({call}, {failure.reason}: {message}); {setting} is "
                        f"{limit}: fix the env or raise {setting}")
    env.restart()
