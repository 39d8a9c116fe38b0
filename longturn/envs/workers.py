"""Envs that step in their own worker process: a hung or crashing env costs one episode, not a run.

Topology: one process per env, started as a fresh interpreter (`worker_main`), never forked
from a parent that may hold torch threads, CUDA or DeepSpeed state. Calls are split in two
(`submit_step` then `wait_step`), so the rollout sends every slot's action first and the envs step
in parallel while the main process collects results and renders the next prompts. A call that
raises, kills its process or does not answer within `timeout_s` raises `EnvFailure`; the process is
then gone and `restart()` starts a fresh one from the spec. Pickling a `WorkerEnv` (a checkpoint)
asks the worker to pickle its env, and unpickling starts a new worker from those bytes, so a resumed
run continues the same episodes.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
import weakref
from multiprocessing.connection import Connection
from typing import Any

from longturn.envs.base import Instructions, Observation
from longturn.envs.failures import EnvFailure
from longturn.envs.registry import EnvSpec
from longturn.envs.termination import ENV_ERROR, TIMEOUT
from longturn.errors import SettingError

log = logging.getLogger(__name__)

# Starting a worker (a Python interpreter, the env's imports, its constructor) may take seconds on
# a busy machine; this limit is apart from the step timeout, which can be much shorter.
START_TIMEOUT_S = 120.0
CLOSE_GRACE_S = 2.0


# Envs step in parallel across processes: one math-library thread each unless the user set it.
SINGLE_THREADED = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _child_env() -> dict[str, str]:
    """The parent's import path, so plug-in modules import in the worker as they do here."""
    path = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
    return {**SINGLE_THREADED, **os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(path))}


def _reap(proc: subprocess.Popen, conn: Connection) -> None:
    """Close the socket and make sure the process is gone (also run when a WorkerEnv is dropped)."""
    try:
        conn.close()
    except OSError:
        pass
    if proc.poll() is None:
        try:
            proc.wait(timeout=CLOSE_GRACE_S)  # it exits on its own once the socket is closed
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class _Process:
    """One running worker: its process, socket, and the request it has not answered yet."""

    def __init__(self, first: tuple[str, Any], timeout_key: str):
        self.timeout_key = timeout_key  # the setting a reset's or step's timeout comes from
        ours, theirs = socket.socketpair()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "longturn.envs.worker_main", str(theirs.fileno()),
                 str(os.getpid())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=_child_env())
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        self._finalizer = weakref.finalize(self, _reap, self.proc, self.conn)
        self.pending: tuple[str, float | None, float | None] | None = None
        self.request(first[0], first[1], START_TIMEOUT_S)

    def request(self, command: str, payload: Any, timeout_s: float | None) -> None:
        if self.pending is not None:
            raise RuntimeError(f"env worker asked to {command} while {self.pending[0]} is pending")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.pending = (command, timeout_s, deadline)
        try:
            self.conn.send((command, payload))
        except OSError:  # the process died: the reply read reports it
            pass

    def reply(self) -> Any:
        """The pending request's result; EnvFailure (the process then killed) when it fails.
        The timeout counts from the request, so replies read one after another share it."""
        assert self.pending is not None
        command, timeout_s, deadline = self.pending
        self.pending = None
        try:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self.conn.poll(left):
                self.kill()
                limit = self.timeout_key if command in ("reset", "step") else "start-up"
                raise EnvFailure(TIMEOUT, f"no answer to {command} within {timeout_s:g} s "
                                          f"({limit}); its worker was killed")
            answer = self.conn.recv()
        except (EOFError, OSError):
            code = self.kill()
            raise EnvFailure(ENV_ERROR, f"the env worker died during {command} "
                                        f"(exit code {code})") from None
        if answer[0] == "error":
            self.kill()  # the env may be half-updated: never reuse it
            raise EnvFailure(ENV_ERROR, answer[1], answer[2])
        return answer[1]

    def kill(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.kill()
        code = self.proc.wait()
        self.conn.close()
        self._finalizer.detach()
        return code

    def close(self) -> None:
        if self.pending is None and self.proc.poll() is None:
            try:
                self.conn.send(("close", None))
            except OSError:
                pass
        self._finalizer()


class WorkerEnv:
    """A TextEnv whose env lives in a worker process (docs/design.md §6: the env interface)."""

    def __init__(self, spec: EnvSpec, timeout_s: float | None = None,
                 timeout_key: str = "env.step_timeout_s"):
        """`timeout_key`: the setting `timeout_s` comes from, named when a call runs past it."""
        self._setup(spec, timeout_s, None, timeout_key)

    def _setup(self, spec: EnvSpec, timeout_s: float | None, blob: bytes | None,
               timeout_key: str) -> None:
        self.spec, self.timeout_s, self.restarts = spec, timeout_s, 0
        self.timeout_key = timeout_key
        self._meta: dict[str, Any] | None = None
        self._static: dict[str, Any] | None = None
        self._instructions: Instructions | None = None
        self._first_start = True
        self._early: EnvFailure | None = None  # a restart that failed, reported at the next wait
        self._worker: _Process | None = _Process(("load", blob) if blob else ("build", spec),
                                                 timeout_key)

    # ------------------------------------------------------------------ process life

    def _ready(self) -> _Process:
        """The worker, once it has built (or loaded) its env."""
        if self._worker is None:
            self._worker = _Process(("build", self.spec), self.timeout_key)
        if self._meta is None:
            try:
                meta = self._worker.reply()
            except EnvFailure as failure:
                self._worker = None
                if self._first_start:  # a bad task or kwarg: the user's to fix, not a retry
                    raise SettingError(f"env {self.spec.name!r} task {self.spec.task!r} could not "
                                     f"be built in its worker process: {failure}") from None
                raise
            self._first_start = False
            self._meta = meta
            self._static = {k: v for k, v in meta.items() if k != "instructions"}
            self._instructions = meta["instructions"] or self._instructions
        return self._worker

    def restart(self) -> None:
        """After a failure: a fresh env from the spec (starting now, ready at the next call)."""
        if self._worker is not None:
            self._worker.kill()
        self.restarts += 1
        self._meta = None
        self._worker = _Process(("build", self.spec), self.timeout_key)
        log.info("env %s/%s worker restarted (%d restart(s) so far)", self.spec.name,
                 self.spec.task, self.restarts)

    # ------------------------------------------------------------------ split calls

    def submit_reset(self, seed: int | None) -> None:
        self._submit("reset", seed)

    def wait_reset(self) -> tuple[Observation, dict[str, Any]]:
        return self._wait()

    def submit_step(self, action: str) -> None:
        self._submit("step", action)

    def wait_step(self) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        return self._wait()

    def _submit(self, command: str, payload: Any) -> None:
        try:
            self._ready().request(command, payload, self.timeout_s)
        except EnvFailure as failure:  # the (re)started worker failed: report it at _wait
            self._early = failure
        else:
            self._early = None

    def _wait(self) -> Any:
        if self._early is not None:
            failure, self._early = self._early, None
            raise failure
        try:
            result, instructions = self._worker.reply()
        except EnvFailure:
            self._worker, self._meta = None, None
            raise
        self._instructions = instructions or self._instructions  # sent only when they change
        return result

    # ------------------------------------------------------------------ the TextEnv interface

    def reset(self, seed: int | None = None) -> tuple[Observation, dict[str, Any]]:
        self.submit_reset(seed)
        return self.wait_reset()

    def step(self, action: str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        self.submit_step(action)
        return self.wait_step()

    def _attr(self, key: str) -> Any:
        """A fixed attribute of the env (name, actions, ...): known from its first start on, so
        reading it never waits on a restarting worker."""
        if self._static is None:
            self._ready()
        return self._static[key]

    name = property(lambda self: self._attr("name"))
    task = property(lambda self: self._attr("task"))
    actions = property(lambda self: self._attr("actions"))
    default_action = property(lambda self: self._attr("default_action"))
    synonyms = property(lambda self: self._attr("synonyms"))
    text_action_space = property(lambda self: self._attr("text_action_space"))

    @property
    def instructions(self) -> Instructions:
        if self._instructions is None:
            self._ready()
        if self._instructions is None:
            raise RuntimeError(f"env {self.spec.name}/{self.spec.task}: no instructions before "
                               "the first reset")
        return self._instructions

    @property
    def pid(self) -> int | None:
        """The worker's process id (None between a failure and the restart)."""
        return None if self._worker is None else self._worker.proc.pid

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    # ------------------------------------------------------------------ checkpoints

    def __getstate__(self) -> dict[str, Any]:
        worker = self._ready()
        worker.request("dump", None, self.timeout_s or START_TIMEOUT_S)
        blob = worker.reply()
        return {"spec": self.spec, "timeout_s": self.timeout_s, "blob": blob,
                "timeout_key": self.timeout_key,
                "instructions": self._instructions, "static": self._static}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._setup(state["spec"], state["timeout_s"], state["blob"],
                    state.get("timeout_key", "env.step_timeout_s"))  # older checkpoints: none
        self._instructions, self._static = state["instructions"], state["static"]
