"""An SGLang server as a child process: launch, wait until it answers, stop it with its children.

SGLang is never imported here: its wheel pins its own torch and transformers, so it runs from its
own interpreter (`python -m sglang.launch_server`) and everything else goes over HTTP.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

import requests

from longturn.errors import UserError

log = logging.getLogger(__name__)

HEALTH_POLL_S = 1.0
STOP_GRACE_S = 30.0
# Logprobs of the raw policy (before temperature), as docs/design.md §6 asks of every engine.
SERVER_ENV = {"SGLANG_RETURN_ORIGINAL_LOGPROB": "1"}
PR_SET_PDEATHSIG = 1


class SGLangError(UserError, RuntimeError):
    """The SGLang server could not start, stopped answering, or answered outside the protocol."""


def launch_command(python: str, model_dir: str, host: str, port: int, tp_size: int = 1,
                   base_gpu_id: int = 0, mem_fraction_static: float | None = None,
                   extra_args: list[str] | None = None) -> list[str]:
    """argv of `sglang.launch_server` for token-in/token-out serving of `model_dir`."""
    cmd = [python, "-m", "sglang.launch_server", "--model-path", model_dir, "--host", host,
           "--port", str(port), "--skip-tokenizer-init", "--tp-size", str(tp_size),
           "--base-gpu-id", str(base_gpu_id)]
    if mem_fraction_static is not None:
        cmd += ["--mem-fraction-static", str(mem_fraction_static)]
    return cmd + list(extra_args or [])


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _own_group_dying_with_parent() -> None:
    """In the child before exec: its own process group, so `stop()` reaches the schedulers it
    forks, and SIGTERM when the stage dies (even by SIGKILL), so no server outlives a killed
    stage holding its GPU memory and port."""
    os.setsid()
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(deque(f, maxlen=lines))
    except OSError:
        return "(no log)"


def new_log_file(port: int, log_dir: str | Path | None) -> Path:
    """A fresh sglang-<port>-*.log in `log_dir` (engine.sglang.log_dir), created if missing, or
    in the system temp dir (TMPDIR) when None."""
    if log_dir is not None:
        try:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise SGLangError(f"engine.sglang.log_dir {str(log_dir)!r} cannot be created: "
                              f"{err.strerror}") from None
    fd, path = tempfile.mkstemp(prefix=f"sglang-{port}-", suffix=".log",
                                dir=None if log_dir is None else str(log_dir))
    os.close(fd)
    return Path(path)


class SGLangServer:
    """One launched server; `url` is where it answers once `start()` returns."""

    def __init__(self, cmd: list[str], host: str, port: int, startup_timeout_s: float,
                 log_dir: str | Path | None = None) -> None:
        self.cmd, self.host, self.port = cmd, host, port
        self.startup_timeout_s = startup_timeout_s
        self.url = f"http://{host}:{port}"
        self.log_dir = log_dir
        self.log_path: Path | None = None  # created by start(), once the port is known free
        self.proc: subprocess.Popen | None = None

    def start(self) -> "SGLangServer":
        """Launch and block until `/health` answers 200; fail with the log's tail otherwise."""
        if not port_is_free(self.host, self.port):
            raise SGLangError(f"port {self.port} on {self.host} is already in use: set "
                              "engine.sglang.port to a free one, or engine.sglang.url to attach "
                              "to the server that holds it")
        self.log_path = new_log_file(self.port, self.log_dir)
        log.info("launching SGLang: %s (log: %s)", " ".join(self.cmd), self.log_path)
        with open(self.log_path, "ab") as out:
            try:
                self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT,
                                             env={**os.environ, **SERVER_ENV},
                                             preexec_fn=_own_group_dying_with_parent)
            except FileNotFoundError:
                self.log_path.unlink(missing_ok=True)  # empty: nothing ran
                raise SGLangError(f"engine.sglang.python {self.cmd[0]!r} was not found: point it "
                                  "at the interpreter of the environment that has sglang") from None
        self._wait_healthy()
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            code = self.proc.poll() if self.proc else None
            if code is not None:
                raise SGLangError(f"SGLang server exited with code {code} before it was ready; "
                                  f"last lines of {self.log_path}:\n{log_tail(self.log_path)}")
            if health_ok(self.url):
                log.info("SGLang server ready at %s", self.url)
                return
            if time.monotonic() > deadline:
                self.stop()
                raise SGLangError(f"SGLang server not ready after {self.startup_timeout_s:.0f} s "
                                  "(engine.sglang.startup_timeout_s); last lines of "
                                  f"{self.log_path}:\n{log_tail(self.log_path)}")
            time.sleep(HEALTH_POLL_S)

    def stop(self) -> None:
        """SIGTERM to the server's process group (it forks schedulers), SIGKILL after a grace."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait_s)
                return
            except subprocess.TimeoutExpired:
                continue


def health_ok(url: str) -> bool:
    """True when `/health` answers 200 (503 while the server loads; refused before it binds)."""
    try:
        return requests.get(f"{url}/health", timeout=5).status_code == 200
    except requests.RequestException:
        return False
