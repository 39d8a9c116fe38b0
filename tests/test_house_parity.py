"""The before/after parity tool of issue 22: its normalisers and comparator on hand-made files
(a changed id, an advantage off by 1e-4, a missing row, a weight off by 1e-3 and an unknown
schema version must each fail, by name), and the tool itself, baseline against this tree."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from parity import ParityError  # noqa: E402
from parity.cases import CASES, apply, overrides, pick  # noqa: E402
from parity.compare import compare_records, compare_weights  # noqa: E402
from parity.normalize import normalise  # noqa: E402
from parity.trees import Tree, check_imports_inside, resolve  # noqa: E402

V1 = {"longturn.schema_version": "1"}
PNG_A, PNG_B = b"\x89PNG frame a", b"\x89PNG frame b"


def write(path: Path, rows: list[dict], meta: dict[str, str]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows).replace_schema_metadata(meta), path)
    return path


def turn_rows() -> list[dict]:
    """Two turns of one episode (turn 1's prompt holds turn 0's reply) and an aborted turn."""
    return [
        dict(episode_id="e0", turn=0, prompt_ids=[1, 2, 3], response_ids=[4, 5], aborted=False,
             advantages=[0.5, 0.25], returns=[1.0, 0.75]),
        dict(episode_id="e0", turn=1, prompt_ids=[1, 2, 3, 4, 5, 6], response_ids=[7, 8],
             aborted=False, advantages=[-0.5, -0.125], returns=[0.0, 0.5]),
        dict(episode_id="e1", turn=0, prompt_ids=[1, 2, 3], response_ids=[9], aborted=True,
             advantages=[0.0], returns=[0.0]),
    ]


def sequence_row() -> dict:
    """Episode e0 of turn_rows() as one sequence: [1 2 3] [4 5] [6] [7 8], a frame at 2."""
    return dict(episode_id="e0", input_ids=[1, 2, 3, 4, 5, 6, 7, 8],
                loss_mask=[0, 0, 0, 1, 1, 0, 1, 1], segment_starts=[3, 6], segment_ends=[5, 8],
                advantages=[0, 0, 0, 0.5, 0.25, 0, -0.5, -0.125],
                returns=[0, 0, 0, 1.0, 0.75, 0, 0.0, 0.5],
                images=[PNG_A, PNG_B], image_starts=[2, 5])


def first_difference(tmp_path: Path, old_rows: list[dict], new_rows: list[dict]) -> str | None:
    old = normalise(write(tmp_path / "old.parquet", old_rows, V1))
    new = normalise(write(tmp_path / "new.parquet", new_rows, V1))
    return compare_records(old, new).first


# ---- normalisers -----------------------------------------------------------------------------

def test_turn_rows_become_records_and_an_aborted_turn_trains_nothing(tmp_path):
    out = normalise(write(tmp_path / "t.parquet", turn_rows(), V1))
    assert list(out.records) == [("e0", 0), ("e0", 1), ("e1", 0)]
    second = out.records["e0", 1]
    assert second.context == (1, 2, 3, 4, 5, 6) and second.reply == (7, 8)
    assert second.advantages == (-0.5, -0.125) and second.returns == (0.0, 0.5)
    aborted = out.records["e1", 0]
    assert aborted.reply == (9,) and aborted.advantages == () and aborted.returns == ()
    assert out.episode_ids == {"e0", "e1"}


def test_conversation_segments_become_records_with_the_frames_before_them(tmp_path):
    meta = {**V1, "longturn.mode": "sequence"}
    out = normalise(write(tmp_path / "s.parquet", [sequence_row()], meta))
    first, second = out.records["e0", 0], out.records["e0", 1]
    assert (first.context, first.reply) == ((1, 2, 3), (4, 5))
    assert (second.context, second.reply) == ((1, 2, 3, 4, 5, 6), (7, 8))
    assert second.advantages == (-0.5, -0.125) and second.returns == (0.0, 0.5)
    assert len(first.images) == 1 and len(second.images) == 2 and first.images[0] == second.images[0]


def test_a_turn_file_and_a_sequence_file_of_the_same_replies_compare_equal(tmp_path):
    """Schema-neutral: either layout (or a new one) only has to give the same records."""
    turns = normalise(write(tmp_path / "t.parquet", turn_rows()[:2], V1))
    row = {**sequence_row(), "images": [], "image_starts": []}
    sequence = normalise(write(tmp_path / "s.parquet", [row], {**V1, "longturn.mode": "sequence"}))
    report = compare_records(turns, sequence)
    assert report.first is None and report.rows_compared == 2


def v2_samples() -> list[dict]:
    """turn_rows() as version-2 samples: a turn is a sample with one reply, [0, len(response))."""
    out = []
    for row in turn_rows():
        reply = dict(start=0, end=len(row["response_ids"]), turn=row["turn"],
                     aborted=row["aborted"])
        out.append(dict(episode_id=row["episode_id"], prompt_ids=row["prompt_ids"],
                        response_ids=row["response_ids"], advantages=row["advantages"],
                        returns=row["returns"], images=[], image_starts=[], replies=[reply]))
    return out


def test_version_2_samples_give_the_records_of_both_version_1_layouts(tmp_path):
    v2 = {"longturn.schema_version": "2"}
    turns = normalise(write(tmp_path / "t1.parquet", turn_rows(), V1))
    report = compare_records(turns, normalise(write(tmp_path / "t2.parquet", v2_samples(), v2)))
    assert report.first is None and report.rows_compared == 3
    # sequence mode: the episode packed at its first reply, the replies spans of the response
    seq = sequence_row()
    packed = dict(episode_id="e0", prompt_ids=seq["input_ids"][:3],
                  response_ids=seq["input_ids"][3:], advantages=seq["advantages"][3:],
                  returns=seq["returns"][3:], images=seq["images"], image_starts=[2, 5],
                  replies=[dict(start=0, end=2, turn=0, aborted=False),
                           dict(start=3, end=5, turn=1, aborted=False)])
    v1 = normalise(write(tmp_path / "s1.parquet", [seq], {**V1, "longturn.mode": "sequence"}))
    report = compare_records(v1, normalise(write(tmp_path / "s2.parquet", [packed], v2)))
    assert report.first is None and report.rows_compared == 2
    packed["replies"][1]["start"] = 2  # one context token taken for a reply token
    report = compare_records(v1, normalise(write(tmp_path / "s3.parquet", [packed], v2)))
    assert report.first == "episode e0 turn 1: context has 6 entries in old, 5 in new"


def test_an_unknown_schema_version_is_an_error_naming_it(tmp_path):
    path = write(tmp_path / "v9.parquet", turn_rows(), {"longturn.schema_version": "9"})
    with pytest.raises(ParityError, match=r"schema version '9' \(mode 'turn'\) has no normaliser"):
        normalise(path)
    with pytest.raises(ParityError, match="no longturn.schema_version"):
        normalise(write(tmp_path / "bare.parquet", turn_rows(), {}))


def test_a_missing_column_is_named(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "returns"} for r in turn_rows()]
    with pytest.raises(ParityError, match="no column 'returns'"):
        normalise(write(tmp_path / "t.parquet", rows, V1))


# ---- the comparator --------------------------------------------------------------------------

def test_equal_files_match_and_float_noise_below_the_tolerance_passes(tmp_path):
    new = turn_rows()
    new[0]["advantages"] = [0.5 + 4e-7, 0.25]
    old_file = normalise(write(tmp_path / "old.parquet", turn_rows(), V1))
    report = compare_records(old_file, normalise(write(tmp_path / "new.parquet", new, V1)))
    assert report.first is None and report.ids_equal and report.rows_compared == 3
    assert 3e-7 < report.max_advantages < 1e-6 and report.max_returns == 0


def test_a_changed_token_id_fails_naming_its_place(tmp_path):
    new = turn_rows()
    new[1]["response_ids"] = [7, 99]
    assert first_difference(tmp_path, turn_rows(), new) == (
        "episode e0 turn 1: reply differs at position 1 (old 8, new 99)")
    new = turn_rows()
    new[1]["prompt_ids"] = [1, 2, 3, 4, 5]
    assert first_difference(tmp_path, turn_rows(), new) == (
        "episode e0 turn 1: context has 6 entries in old, 5 in new")


def test_an_advantage_off_by_1e_4_fails(tmp_path):
    new = turn_rows()
    new[1]["advantages"] = [-0.5, -0.125 + 1e-4]
    first = first_difference(tmp_path, turn_rows(), new)
    assert first.startswith("episode e0 turn 1: advantages differs at position 1 by 0.0001")
    new = turn_rows()
    new[0]["returns"] = [1.0, 0.75 - 1e-4]
    assert "episode e0 turn 0: returns differs at position 1" in first_difference(
        tmp_path, turn_rows(), new)


def test_a_missing_row_and_a_missing_episode_fail(tmp_path):
    assert first_difference(tmp_path, turn_rows(), turn_rows()[:2] + turn_rows()[:0]) == (
        "episode e1 turn 0: missing in new")
    assert first_difference(tmp_path, turn_rows()[:2], turn_rows()) == (
        "episode e1 turn 0: only in new")


def test_an_episode_without_a_reply_still_counts(tmp_path):
    meta = {**V1, "longturn.mode": "sequence"}
    empty = {**sequence_row(), "episode_id": "e9", "segment_starts": [], "segment_ends": []}
    old = normalise(write(tmp_path / "o.parquet", [sequence_row(), empty], meta))
    new = normalise(write(tmp_path / "n.parquet", [sequence_row()], meta))
    report = compare_records(old, new)
    assert not report.ids_equal and "only in old ['e9']" in report.first


def save(directory: Path, tensors: dict[str, torch.Tensor], name: str = "model.safetensors"):
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / name))


def test_weights_within_tolerance_pass_and_report_the_largest_deviation(tmp_path):
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7
    save(tmp_path / "old", {"a": w, "b": torch.ones(2, dtype=torch.bfloat16)})
    save(tmp_path / "new", {"a": w + 2e-6, "b": torch.ones(2, dtype=torch.bfloat16)})
    report = compare_weights(tmp_path / "old", tmp_path / "new")
    assert report.first is None and report.tensors == 2
    assert report.max_diff == pytest.approx(2e-6, rel=0.1)


def test_a_weight_off_by_1e_3_fails_naming_the_tensor(tmp_path):
    w = torch.zeros(3, 4)
    moved = w.clone()
    moved[1, 2] = 1e-3
    save(tmp_path / "old", {"layer.weight": w})
    save(tmp_path / "new", {"layer.weight": moved})
    report = compare_weights(tmp_path / "old", tmp_path / "new")
    assert report.first == ("weights: model.safetensors: layer.weight differs by 0.001 at flat "
                            "index 6 (tolerance 1e-05)")


def test_other_shapes_names_or_files_fail(tmp_path):
    save(tmp_path / "old", {"w": torch.zeros(2, 3)})
    save(tmp_path / "new", {"w": torch.zeros(3, 2)})
    assert "w has shape (2, 3) in old, (3, 2) in new" in compare_weights(
        tmp_path / "old", tmp_path / "new").first
    save(tmp_path / "new", {"w": torch.zeros(2, 3)}, "adapter.safetensors")
    assert "only in new ['adapter.safetensors']" in compare_weights(
        tmp_path / "old", tmp_path / "new").first


# ---- cases and trees ---------------------------------------------------------------------------

def test_overrides_take_the_first_key_a_params_file_has_and_name_a_missing_one():
    params = {"rollout": {"protocol": "action", "n_envs": 8}, "context": {"max_tokens": 2048}}
    apply(params, {"rollout.n_envs": 2, ("rollout.chat.max_tokens", "context.max_tokens"): 9},
          "here")
    assert params == {"rollout": {"protocol": "action", "n_envs": 2}, "context": {"max_tokens": 9}}
    with pytest.raises(ParityError, match=r"here: no key 'rollout.turns' in the params file"):
        apply(params, {"rollout.turns": 3}, "here")


def test_without_a_model_a_case_keeps_its_profiles_own_and_tiny_shortens_replies():
    gigpo = pick("c")[0]
    full = overrides(gigpo, None, tiny=False)
    assert "model.source" not in full and "engine.sampling.max_new_tokens" not in full
    assert full["algo.advantage"] == "gigpo" and full["rollout.n_envs"] == 4  # the case wins
    tiny = overrides(gigpo, "/m", tiny=True)
    assert tiny["model.source"] == "/m" and tiny["engine.sampling.max_new_tokens"] == 8


def test_cases_are_the_four_of_issue_22_and_an_unknown_letter_is_named():
    assert [(c.letter, c.name, c.critic) for c in CASES] == [
        ("a", "default", True), ("b", "tools", True), ("c", "gigpo", False),
        ("d", "vision", True)]
    assert [c.name for c in pick("d,a")] == ["default", "vision"]
    with pytest.raises(ParityError, match=r"--cases 'a,x': unknown case \['x'\]"):
        pick("a,x")


def test_a_tree_without_its_own_longturn_is_refused(tmp_path):
    """The venv's editable install would answer `import longturn` from the main checkout."""
    with pytest.raises(ParityError, match=str(tmp_path)):
        check_imports_inside(Tree("old", tmp_path, "deadbeef"))


def test_an_unknown_revision_is_named():
    with pytest.raises(ParityError, match="commit no-such-rev-22 is not in the repository"):
        resolve(ROOT, "no-such-rev-22")


# ---- the tool, end to end --------------------------------------------------------------------

def git_state(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def test_baseline_and_this_tree_agree_on_all_four_cases(tiny_model_dir, tmp_path):
    shallow = git_state("rev-parse", "--is-shallow-repository")
    if shallow.returncode != 0:
        pytest.skip(f"{ROOT} is not a git checkout: no baseline to compare with")
    if shallow.stdout.strip() == "true":
        pytest.skip("shallow clone: the baseline commit's history is not here")
    tool = ROOT / "bench/house_parity.py"
    spec = importlib.util.spec_from_file_location("house_parity", tool)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert git_state("cat-file", "-e", f"{module.BASELINE}^{{commit}}").returncode == 0, (
        f"baseline commit {module.BASELINE} is not in this clone")
    proc = subprocess.run([sys.executable, str(tool), "--tiny", "--tiny-dir", tiny_model_dir,
                           "--keep", str(tmp_path / "runs")],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for case in ("a default", "b tools", "c gigpo", "d vision"):
        line = next(x for x in proc.stdout.splitlines() if x.startswith(case))
        assert line.endswith("same") and " equal " in line, line
    assert "parity: 4 case(s) the same" in proc.stdout
