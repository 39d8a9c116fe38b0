"""The base class of mistakes a user can fix (a setting, a path, the machine), as opposed to bugs.

Stage scripts print these as one line naming what to change and exit 2; anything else keeps its
traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input or machine; the message says what to change."""


class SettingError(UserError, ValueError):
    """A setting names something that does not exist or does not fit (an env, task, engine,
    kwarg, or a checkpoint made with other sizes). Also a ValueError: it is a bad value."""


class ModelDirError(UserError):
    """A model dir a stage reads is missing, empty, or holds damaged files."""


class TrajectoryFileError(UserError):
    """A turn or episode Parquet file is damaged or lacks a column of the contract."""


class OutputNotWritable(UserError):
    """A path cannot be written: the disk is full, read-only, or not ours."""
