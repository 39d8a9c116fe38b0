"""Every test, and every process a test starts, writes its temp files under the session's pytest
basetemp (which pytest prunes), never the system temp dir: library code that uses `tempfile`
(SGLang server logs, rendezvous dirs) or a child honouring TMPDIR would otherwise leave litter
there that nothing removes, worst after a SIGKILL.

A pytest plugin: `pytest_plugins = ("temp_hygiene",)` in conftest, or `-p temp_hygiene`."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="session")
def private_temp_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """TMPDIR (children) and tempfile.tempdir (this process, which caches it) point at one dir
    under the basetemp for the whole session; the basetemp itself is fixed before the switch."""
    private = tmp_path_factory.mktemp("tmpdir", numbered=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(private))
        patch.setattr(tempfile, "tempdir", str(private))
        yield private
