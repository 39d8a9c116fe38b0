"""The env worker process: one env, driven by requests from its `WorkerEnv` over a socket.

Started as `python -m longturn.envs.worker_main FD PARENT_PID` (a fresh interpreter: nothing of the
parent's torch, CUDA or DeepSpeed state, no inherited threads). Each request `(command, payload)`
gets exactly one reply: `("ok", result)` or `("error", message, traceback)`. The process ends when
its parent closes the socket or dies (Linux: it is killed with its parent even while an env call
hangs).
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

from longturn.envs.base import Instructions, TextEnv

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


class Host:
    """The env of this process and the last instructions sent (resent only when they change)."""

    def __init__(self) -> None:
        self.env: TextEnv | None = None
        self.sent: Instructions | None = None

    def changed_instructions(self) -> Instructions | None:
        try:
            current = self.env.instructions
        except Exception:  # many envs know their goal only after reset
            return None
        if current is None or current == self.sent:
            return None
        self.sent = current
        return current

    def describe(self) -> dict[str, Any]:
        env = self.env
        return {"name": env.name, "task": env.task, "actions": list(env.actions),
                "default_action": env.default_action, "synonyms": dict(env.synonyms),
                "text_action_space": getattr(env, "text_action_space", None),
                "instructions": self.changed_instructions()}

    def handle(self, command: str, payload: Any) -> Any:
        if command in ("build", "load"):  # from an EnvSpec, or from a checkpoint's bytes
            self.env = payload.build() if command == "build" else pickle.loads(payload)
            return self.describe()
        if command == "reset":
            obs, info = self.env.reset(seed=payload)
            return (obs, info), self.changed_instructions()
        if command == "step":
            obs, reward, terminated, truncated, info = self.env.step(payload)
            return (obs, reward, terminated, truncated, info), self.changed_instructions()
        if command == "dump":
            return pickle.dumps(self.env)
        if command == "close":
            if self.env is not None:
                self.env.close()
            return None
        raise ValueError(f"unknown worker command {command!r}")


def serve(conn: Connection) -> None:
    host = Host()
    while True:
        try:
            command, payload = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply: tuple = ("ok", host.handle(command, payload))
        except Exception as err:
            reply = ("error", f"{type(err).__name__}: {err}", traceback.format_exc())
        try:
            conn.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError) as err:  # cannot be pickled
            conn.send(("error", f"the env's {command} result cannot be sent: {err}", ""))
        except (BrokenPipeError, OSError):
            return
        if command == "close":
            return


def main(argv: list[str] | None = None) -> None:
    fd, parent_pid = (int(a) for a in (argv or sys.argv[1:]))
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the stage, which stops us
    serve(Connection(fd))


if __name__ == "__main__":
    main()
