"""The base class of mistakes a user can fix (a setting, a path, the machine), as opposed to bugs.

Stage scripts print these as one line naming what to change and exit 2; anything else keeps its
traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input or machine; the message says what to change."""
