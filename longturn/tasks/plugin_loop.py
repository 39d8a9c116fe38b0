"""One event loop, on a thread of its own, on which the tools' and interactions' calls of one
lock-step of the rollout run together.

Why a loop: verl-style tools and interactions are coroutines, and 64 episodes each waiting on a
sandbox or a search API must wait at the same time, not one after another. Why its own thread,
kept for the process: the rollout is synchronous and may itself be called from inside a running
loop, and a tool may keep loop-bound state from `create` to `execute` (an HTTP session, a
background task), so every call must see the same loop. This project's synchronous tools and
interactions run in the loop's worker threads (`invoke`), so a call that hangs is cut off for
them too (the thread itself cannot be stopped and finishes on its own).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_owner_pid: int | None = None


def _running_loop() -> asyncio.AbstractEventLoop:
    """The process's plug-in loop, started on first use (and again in a forked child, which
    inherits the loop object but not its thread)."""
    global _loop, _owner_pid
    with _lock:
        if _loop is None or _owner_pid != os.getpid() or _loop.is_closed():
            _loop = asyncio.new_event_loop()
            _owner_pid = os.getpid()
            threading.Thread(target=_loop.run_forever, name="longturn-plugins",
                             daemon=True).start()
        return _loop


async def invoke(method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a plug-in method, a coroutine function awaited on the loop or a plain one run in a
    worker thread; a plain one that returns an awaitable has it awaited too."""
    if inspect.iscoroutinefunction(method):
        return await method(*args, **kwargs)
    value = await asyncio.to_thread(method, *args, **kwargs)
    return await value if inspect.isawaitable(value) else value


class CallTimedOut(Exception):
    """A plug-in call ran past its time limit (not a TimeoutError the plug-in raised itself)."""


async def within(awaitable: Awaitable[Any], timeout_s: float | None) -> Any:
    """`awaitable`'s value, or CallTimedOut after `timeout_s` seconds (None: no limit)."""
    task = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if not done:
        task.cancel()
        raise CallTimedOut(f"no answer within {timeout_s:g} s")
    return task.result()


def run_together(calls: Sequence[Callable[[], Awaitable[Any]]]) -> list[Any]:
    """Start every call at once on the plug-in loop and wait for all; their values in order.
    When calls raise, the first one's exception is raised after all have ended, so none is left
    running unseen."""
    if not calls:
        return []

    async def gather() -> list[Any]:
        return await asyncio.gather(*(call() for call in calls), return_exceptions=True)

    outcomes = asyncio.run_coroutine_threadsafe(gather(), _running_loop()).result()
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return outcomes
