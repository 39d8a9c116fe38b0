"""`rollout.chat.function` by import path: the built-in, a user's function, and named errors."""

from __future__ import annotations

import pytest

from longturn.errors import SettingError
from longturn.rollout.functions import BUILTIN, resolve_rollout_function
from longturn.rollout.conversation_rollout import conversation_rollout


def echo_rollout(engine, tokenizer, sampling, tasks, settings):
    """A user's rollout: one record per task, made without any engine."""
    return [{"episode_id": f"echo-{i}", "task": t["task"]} for i, t in enumerate(tasks)]


def too_few(engine, tasks):
    return []


def test_builtin_is_resolved_by_its_path():
    assert resolve_rollout_function() is conversation_rollout
    assert resolve_rollout_function(BUILTIN) is conversation_rollout


def test_a_users_function_is_called_with_the_five_arguments():
    fn = resolve_rollout_function("test_rollout_function:echo_rollout")
    assert fn(None, None, None, [{"task": "a"}], None) == [{"episode_id": "echo-0", "task": "a"}]


@pytest.mark.parametrize("path, message", [
    ("test_rollout_function:too_few", "must take"),
    ("test_rollout_function:missing", "has no 'missing'"),
    ("no_such_module:fn", "cannot import module"),
    ("", "import path"),
])
def test_bad_function_paths_name_the_setting(path, message):
    with pytest.raises(SettingError, match=message):
        resolve_rollout_function(path)
