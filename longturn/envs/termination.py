"""Why an episode ended: one word per episode, counted per training iteration and per eval task.

An episode that ended on its own is a `success`, a `failure` (terminated without success) or hit its
`time_limit` (truncated: the env's limit or `env.max_turns`). An aborted episode is cut short by the
env itself: it raised (`env_error`, also a worker process that died) or did not answer within
`env.step_timeout_s` (`timeout`). Aborted episodes are out of the loss and out of success rates,
and counted apart, so a flaky env never reads as a weak policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SUCCESS = "success"
FAILURE = "failure"
TIME_LIMIT = "time_limit"
ENV_ERROR = "env_error"
TIMEOUT = "timeout"

REASONS = (SUCCESS, FAILURE, TIME_LIMIT, ENV_ERROR, TIMEOUT)
ABORTED = (ENV_ERROR, TIMEOUT)
PREFIX = "termination/"  # metric keys: termination/success, termination/timeout, ...


def reason_of(record: Mapping[str, Any]) -> str | None:
    """The reason of a turn row or episode row that ended, None when it did not end.

    A row may carry its own `termination` (set by the rollout, which knows a timeout from an error);
    rows read back from Parquet do not, and are classified from their flags (an aborted one as
    env_error)."""
    stored = record.get("termination")
    if stored:
        return str(stored)
    if record.get("aborted"):
        return ENV_ERROR
    if record.get("success") and (record.get("terminated") or record.get("truncated")):
        return SUCCESS
    if record.get("terminated"):
        return FAILURE
    if record.get("truncated"):
        return TIME_LIMIT
    return None
