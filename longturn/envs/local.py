"""An env stepped in this process, behind the same split calls as `WorkerEnv`.

The rollout talks to every env the same way: `submit_reset`/`wait_reset`, `submit_step`/
`wait_step` (raising `EnvFailure`), and `restart()` after a failure. Here the call runs at submit
and its exception is kept for the wait; there is no timeout (an in-process call cannot be
interrupted: use `env.workers: true` for that). `restart()` rebuilds the env from its spec when it
has one. Every other attribute (name, actions, instructions, reset, step, close) is the env's.
"""

from __future__ import annotations

from typing import Any

from longturn.envs.base import Observation, TextEnv
from longturn.envs.failures import EnvFailure
from longturn.envs.registry import EnvSpec


class LocalEnv:
    """Wraps one in-process TextEnv; `spec` (optional) says how to build it again."""

    def __init__(self, env: TextEnv, spec: EnvSpec | None = None):
        self.env, self.spec = env, spec
        self._outcome: Any = None
        self._broken: EnvFailure | None = None  # a rebuild that raised: every call fails with it

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") or attr in ("env", "spec"):
            raise AttributeError(attr)
        return getattr(self.env, attr)

    def _run(self, call: Any, *args: Any) -> None:
        if self._broken is not None:
            self._outcome = self._broken
            return
        try:
            self._outcome = call(*args)
        except Exception as err:  # an env bug costs its episode, not the run
            self._outcome = EnvFailure.from_exception(err)

    def _result(self) -> Any:
        outcome, self._outcome = self._outcome, None
        if isinstance(outcome, EnvFailure):
            raise outcome
        return outcome

    def submit_reset(self, seed: int | None) -> None:
        self._run(lambda: self.env.reset(seed=seed))

    def wait_reset(self) -> tuple[Observation, dict[str, Any]]:
        return self._result()

    def submit_step(self, action: str) -> None:
        self._run(self.env.step, action)

    def wait_step(self) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        return self._result()

    def restart(self) -> None:
        """A fresh env from the spec; without one (an env handed in built), the same env goes on
        (its next reset starts clean)."""
        if self.spec is None:
            return
        try:
            self.env.close()
        except Exception:
            pass
        try:
            self.env, self._broken = self.spec.build(), None
        except Exception as err:
            self._broken = EnvFailure.from_exception(err)
