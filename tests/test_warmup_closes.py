"""The critic warm-up's collection stops its env workers and its engine on every exit (issue 21:
they used to outlive a warm-up that finished, and the engine one whose collector failed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from longturn.run import warmup
from longturn.params.config import parse_params


class Recorder:
    """An engine or a collector that records being closed; its collect may be made to fail."""

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.closed, self.batches = fail, 0, 0

    def collect(self, *args, **kwargs) -> list[dict]:
        if self.fail:
            raise RuntimeError("env died")
        self.batches += 1
        return [{"turn": self.batches}]

    def close(self) -> None:
        self.closed += 1


@pytest.fixture
def parts(monkeypatch: pytest.MonkeyPatch) -> dict[str, Recorder]:
    made = {"engine": Recorder(), "collector": Recorder()}
    monkeypatch.setattr(warmup, "load_tokenizer", lambda base: object())
    monkeypatch.setattr(warmup, "make_engine", lambda base, params: made["engine"])
    monkeypatch.setattr(warmup, "make_collector", lambda params, rank, run_id: made["collector"])
    return made


PARAMS = parse_params({"warmup": {"batches": 2}})


def test_a_finished_collection_closes_collector_and_engine(parts) -> None:
    rows = warmup.collect_frozen(PARAMS, Path("base"), 0, progress=False)
    assert rows == [{"turn": 1}, {"turn": 2}]
    assert (parts["collector"].closed, parts["engine"].closed) == (1, 1)


def test_a_failing_batch_closes_collector_and_engine(parts) -> None:
    parts["collector"].fail = True
    with pytest.raises(RuntimeError, match="env died"):
        warmup.collect_frozen(PARAMS, Path("base"), 0, progress=False)
    assert (parts["collector"].closed, parts["engine"].closed) == (1, 1)


def test_a_collector_that_cannot_start_still_closes_the_engine(parts, monkeypatch) -> None:
    def refuse(params, rank, run_id):
        raise RuntimeError("no env")
    monkeypatch.setattr(warmup, "make_collector", refuse)
    with pytest.raises(RuntimeError, match="no env"):
        warmup.collect_frozen(PARAMS, Path("base"), 0, progress=False)
    assert parts["engine"].closed == 1
