"""What an env failure looks like to the rollout: one episode lost, or (repeated) the stage stopped.

`EnvFailure` is one reset or step that raised, crashed its worker or hung past
`env.step_timeout_s`: the rollout aborts that episode, restarts the env and goes on. `EnvGaveUp` is
more than `env.max_retries` failures of one env slot in a row: a deterministically broken env must
stop the stage with one line rather than loop forever.
"""

from __future__ import annotations

import traceback

from longturn.envs.termination import ENV_ERROR
from longturn.errors import UserError


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
    """An env slot failed more than env.max_retries times in a row."""
