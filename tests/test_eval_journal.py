"""The evaluation journal: finished episodes written part by part, read back by a rerun, discarded
when they were played with something else, and a torn part dropped (its episodes played again)."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import longturn
from longturn.errors import OutputNotWritable
from longturn.run.eval_journal import PARTIAL, EvalJournal
from longturn.params.config import parse_params
from longturn.run.eval_key import (_digest, agent_code_digest, code_digest, evaluation_key,
                                   weights_digest)
from turn_rows import samples_from_turns
from longturn.trajectories import SAMPLE_SCHEMA, file_metadata

KEY = {"journal": "1", "params": "p", "weights": "w", "code": "c"}


def episode(seed: int, length: int = 2) -> tuple[dict, list[dict]]:
    eid = f"eval-goto-{seed}"
    row = {"run_id": "eval", "policy_version": "base", "env_name": "babyai", "task": "goto",
           "episode_id": eid, "episode_seed": seed, "success": seed % 2 == 0,
           "return": 0.1 * seed, "env_return": 0.1 * seed, "length": length,
           "valid_actions": 1, "valid_action_ratio": 0.5, "terminated": False,
           "truncated": True, "aborted": False, "termination": "time_limit"}
    turns = [{"episode_id": eid, "task": "goto", "episode_seed": seed, "turn": t, "step": t,
              "env_index": 0, "prompt_ids": [1, 2, t], "response_ids": [3], "reward": 0.25}
             for t in range(length)]
    return row, samples_from_turns(turns)  # window samples, as evaluation journals them


def journal(out, key=KEY, flush_every=1) -> EvalJournal:
    return EvalJournal.open(out, key, SAMPLE_SCHEMA, file_metadata({"policy_version": "base"}),
                            flush_every)


def test_episodes_are_written_as_parts_and_read_back_by_a_rerun(tmp_path):
    first = journal(tmp_path, flush_every=2)
    for seed in (1000, 1001, 1002):
        first.add(*episode(seed))
    assert sorted(p.name for p in (tmp_path / PARTIAL).glob("part-*")) == [
        "part-00000.episodes.parquet", "part-00000.turns.parquet"]  # the third still waits
    first.flush()

    again = journal(tmp_path)
    assert list(again.finished) == ["eval-goto-1000", "eval-goto-1001", "eval-goto-1002"]
    assert again.finished["eval-goto-1001"]["return"] == 0.1 * 1001  # float64, exactly
    assert again.turns().equals(first.turns())
    assert [e["episode_seed"] for e in again.episodes(["eval-goto-1002", "eval-goto-9",
                                                        "eval-goto-1000"])] == [1002, 1000]
    again.add(*episode(1003))
    assert (tmp_path / PARTIAL / "part-00002.episodes.parquet").is_file()  # numbering goes on
    again.remove()
    assert not (tmp_path / PARTIAL).exists()


def test_a_journal_of_other_settings_is_discarded_with_one_line(tmp_path, caplog):
    journal(tmp_path).add(*episode(1000))
    caplog.set_level(logging.INFO, logger="longturn.run.eval_journal")
    other = journal(tmp_path, {**KEY, "weights": "other", "code": "new"})
    assert other.finished == {}
    assert not list((tmp_path / PARTIAL).glob("part-*"))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].endswith("(1 parts): played with other weights, code")


def test_a_torn_part_is_dropped_with_one_line_and_the_rest_kept(tmp_path, caplog):
    first = journal(tmp_path)
    for seed in (1000, 1001, 1002):
        first.add(*episode(seed))
    torn = tmp_path / PARTIAL / "part-00001.turns.parquet"
    torn.write_bytes(torn.read_bytes()[:-20])  # a copy cut short
    (tmp_path / PARTIAL / "part-00003.turns.parquet").write_bytes(b"killed before its episodes")
    (tmp_path / PARTIAL / ".part-00004.turns.parquet.tmp-99").write_bytes(b"PAR1 half")
    caplog.set_level(logging.INFO, logger="longturn.run.eval_journal")

    again = journal(tmp_path)

    assert list(again.finished) == ["eval-goto-1000", "eval-goto-1002"]
    assert sorted(again.turns()["episode_seed"].to_pylist()) == [1000, 1000, 1002, 1002]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "part-00001.episodes.parquet dropped" in warnings[0]
    assert sorted(p.name for p in (tmp_path / PARTIAL).iterdir()) == [
        "key.json", "part-00000.episodes.parquet", "part-00000.turns.parquet",
        "part-00002.episodes.parquet", "part-00002.turns.parquet"]
    again.add(*episode(1001))
    assert (tmp_path / PARTIAL / "part-00004.episodes.parquet").is_file()
    assert pq.read_table(tmp_path / PARTIAL / "part-00004.turns.parquet").num_rows == 2


def test_a_part_that_cannot_be_written_names_its_path(tmp_path, monkeypatch):
    first = journal(tmp_path)
    real = pq.write_table

    def read_only(table, where, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(pq, "write_table", read_only)
    with pytest.raises(OutputNotWritable, match=r"part-00000\.turns\.parquet: read-only file"):
        first.add(*episode(1000))
    monkeypatch.setattr(pq, "write_table", real)
    assert journal(tmp_path).finished == {}


def test_the_key_names_weights_and_code_by_what_changes_them(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    before = weights_digest(tmp_path)
    assert weights_digest(tmp_path) == before
    later = (tmp_path / "model.safetensors").stat().st_mtime_ns + 10**9
    os.utime(tmp_path / "model.safetensors", ns=(later, later))
    assert weights_digest(tmp_path) != before  # written again: other weights
    package = tmp_path / "pkg"
    (package / "__pycache__").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    code = code_digest(package)
    (package / "__pycache__" / "a.pyc").write_bytes(b"cache")
    assert code_digest(package) == code
    (package / "a.py").write_text("x = 2\n")
    assert code_digest(package) != code


def test_the_code_digest_covers_the_whole_package_not_one_folder():
    """An edit anywhere in longturn (the rollout, an env) discards the journal, not only one in
    run/ beside the key's own module."""
    assert code_digest() == code_digest(Path(longturn.__file__).parent)


def test_the_key_changes_with_the_agents_source(tmp_path, monkeypatch):
    """The import string stays the same while the agent's file is edited: other agent code."""
    monkeypatch.syspath_prepend(str(tmp_path))
    agent = tmp_path / "journal_key_agent.py"
    agent.write_text("def agent(task, base_url):\n    return 1.0\n")
    params = parse_params({"rollout": {"protocol": "chat",
                                       "agent": "journal_key_agent:agent"}})
    key = evaluation_key(params, "base", "eval", None)
    assert evaluation_key(params, "base", "eval", None) == key
    agent.write_text("def agent(task, base_url):\n    return 0.0\n")
    edited = evaluation_key(params, "base", "eval", None)
    assert edited["agent code"] != key["agent code"]
    assert {k for k in key if key[k] != edited[k]} == {"agent code"}
    builtin = parse_params({"rollout": {"protocol": "chat", "agent": "sys:exit"}})
    assert agent_code_digest(builtin) == _digest({"sys:exit": "sys:exit"})  # no file: its name
