"""The two gates fail as a user sees it: exit code 2 and one line like every other user error,
and nothing left behind that a later stage could take as valid. Under DVC, `dvc repro train`
stops at a failing validation, and the stage's exit code and line come through."""

from __future__ import annotations

import json
from pathlib import Path


from components import critic_warmup, validate_prompts
from longturn.run.validation import PASSED_MARKER
from test_pipeline_smoke import dvc_run, scratch_repo, toy_params, write_params


def gate_params(tmp_path: Path, model_dir: str, min_ratio: float) -> str:
    params = toy_params(model_dir)
    params["env"]["tasks"] = params["eval"]["tasks"] = ["goto"]
    params["validation"].update(samples_per_task=2, min_valid_action_ratio=min_ratio)
    return write_params(tmp_path / "params.yaml", params)


def test_validation_gate_fails_without_a_passed_marker(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "validation"
    out.mkdir()
    (out / PASSED_MARKER).write_text("from an earlier run that passed\n")
    params = gate_params(tmp_path, tiny_model_dir, min_ratio=1.0)  # a random model never gets 1.0

    code = validate_prompts.main(["--params", params, "--model-dir", tiny_model_dir,
                                  "--out", str(out)])

    assert code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("validate_prompts:")]
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith("validate_prompts: error: gate failed: task 'goto': "
                               "valid-action ratio")
    assert "< validation.min_valid_action_ratio 1.00" in lines[0]
    assert lines[0].endswith(f"; see {out / 'report.md'}")
    assert not (out / PASSED_MARKER).exists()  # the stale marker is gone, none was written
    assert json.loads((out / "metrics.json").read_text())["passed"] is False
    assert "Prompt validation: FAILED" in (out / "report.md").read_text()  # why, for reading


def test_validation_gate_passes_with_a_marker(tmp_path, tiny_model_dir):
    out = tmp_path / "validation"
    params = gate_params(tmp_path, tiny_model_dir, min_ratio=0.0)
    assert validate_prompts.main(["--params", params, "--model-dir", tiny_model_dir,
                                  "--out", str(out)]) == 0
    assert (out / PASSED_MARKER).is_file()
    assert json.loads((out / "metrics.json").read_text())["passed"] is True


def test_warmup_gate_fails_without_a_critic(tmp_path, tiny_model_dir, capsys):
    params = toy_params(tiny_model_dir)
    params["env"]["tasks"] = ["goto"]
    params["warmup"].update(iterations=1, max_final_loss=1e-12)  # no critic gets this low
    path = write_params(tmp_path / "params.yaml", params)
    warm = tmp_path / "critic/warm"
    warm.mkdir(parents=True)
    (warm / "config.json").write_text("{}")  # a critic from an earlier run

    code = critic_warmup.main(["--params", path, "--model-dir", tiny_model_dir,
                               "--out", str(warm), "--live", str(tmp_path / "critic/live"),
                               "--work", str(tmp_path / "critic/batches"),
                               "--metrics", str(tmp_path / "critic/metrics.json")])

    assert code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("critic_warmup:")]
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith("critic_warmup: error: critic warm-up: final value loss ")
    assert "> warmup.max_final_loss 1e-12" in lines[0]
    assert not warm.exists() and not list(warm.parent.glob(".warm.tmp-*"))
    assert not (tmp_path / "critic/metrics.json").exists()


def test_dvc_repro_train_stops_at_a_failing_validation(tmp_path, tiny_model_dir):
    repo = scratch_repo(tmp_path, toy_params(tiny_model_dir))
    params = toy_params(tiny_model_dir)
    params["validation"]["min_valid_action_ratio"] = 1.0
    write_params(repo / "params.yaml", params)

    proc = dvc_run(repo, "repro", "train")

    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "Running stage 'validate_prompts'" in out
    assert "python components/validate_prompts.py" in out and ", exited with 2" in out
    lines = [line for line in out.splitlines() if line.startswith("validate_prompts:")]
    assert len(lines) == 1 and "Traceback" not in out, out
    assert lines[0].startswith("validate_prompts: error: gate failed: task 'goto': ")
    assert "; task 'open': " in lines[0]  # every failing task, still one line
    for stage in ("critic_warmup", "train"):
        assert f"Running stage '{stage}'" not in out
    assert not (repo / "data/validation" / PASSED_MARKER).exists()
    assert not (repo / "data/critic").exists() and not (repo / "data/train").exists()
    assert "Running stage 'zero_shot_eval'" not in out  # train does not need it
    # train alone cannot skip the gate either, even next to a critic from an earlier run
    (repo / "data/critic/warm").mkdir(parents=True)
    (repo / "data/critic/warm/config.json").write_text("{}")
    single = dvc_run(repo, "repro", "--single-item", "train")
    assert single.returncode != 0 and "data/validation/passed" in single.stdout + single.stderr
    assert not (repo / "data/train").exists()
