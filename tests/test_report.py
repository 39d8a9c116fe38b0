"""The report stage on synthetic inputs: real eval metrics layout, real DVCLive folders."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from longturn.atomic import write_json
from longturn.evaluation import metrics_by_task
from longturn.report import build_report, comparison_table, read_live_metrics
from longturn.stats import wilson_interval

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ["curves.png", "tasks.png", "kl.png", "warmup.png"]


def fake_episodes(task: str, wins: int, n: int, length: int = 10, valid: int = 8) -> list[dict]:
    return [{"task": task, "success": i < wins, "length": length, "return": float(i < wins),
             "env_return": float(i < wins), "valid_actions": valid} for i in range(n)]


def write_eval(folder: Path, counts: dict[str, tuple[int, int]]) -> dict:
    episodes = [e for t, (w, n) in counts.items() for e in fake_episodes(t, w, n)]
    metrics = metrics_by_task(episodes, list(counts))
    write_json(folder / "metrics.json", metrics)
    return metrics


def write_live(root: Path, live_dir: str, series: dict[str, list[float]]) -> Path:
    """Log like the train stage does: Live(dir, save_dvc_exp=False), log_metric, next_step."""
    from dvclive import Live

    with contextlib.chdir(root):  # Live writes a dvc.yaml next to the CWD: keep it in tmp
        live = Live(dir=live_dir, save_dvc_exp=False)
        for step in range(len(next(iter(series.values())))):
            for key, values in series.items():
                live.log_metric(key, values[step])
            live.next_step()
        live.end()
    return root / live_dir


TRAIN = {"train/success_rate": [0.1, 0.3, 0.5], "train/mean_reward": [0.0, 0.2, 0.4],
         "train/kl_think": [0.0, 0.01, 0.02], "train/kl_action": [0.0, 0.05, 0.12],
         "train/value_loss": [1.0, 0.6, 0.4], "train/explained_variance": [-0.2, 0.1, 0.3],
         "train/entropy": [2.0, 1.9, 1.8]}
WARMUP = {"warmup/value_loss": [2.0, 1.0, 0.5]}
ZERO_SHOT = {"goto": (0, 20), "pickup": (2, 8)}
FINAL = {"goto": (18, 20), "pickup": (3, 8), "open": (3, 4)}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("report_inputs", numbered=True)
    write_eval(root / "eval/zero_shot", ZERO_SHOT)
    write_eval(root / "eval/final", FINAL)
    return {"zero_shot": root / "eval/zero_shot", "final": root / "eval/final",
            "train": write_live(root, "train/live", TRAIN),
            "warmup": write_live(root, "critic/live", WARMUP), "root": root}


@pytest.fixture(scope="module")
def full_report(inputs: dict[str, Path]) -> Path:
    out = inputs["root"] / "report"
    return build_report(inputs["zero_shot"], inputs["final"], inputs["train"], inputs["warmup"],
                        out, {"model.source": "tiny", "env.tasks": ["goto", "pickup"]})


def cell(wins: int, n: int) -> str:
    low, high = wilson_interval(wins, n)
    return f"{wins}/{n} = {wins / n:.2f} [{low:.2f}, {high:.2f}]"


def test_read_live_metrics_one_row_per_step_without_namespace(inputs: dict[str, Path]) -> None:
    df = read_live_metrics(inputs["train"])
    assert list(df.index) == [0, 1, 2]
    assert set(df.columns) == {k.split("/", 1)[1] for k in TRAIN}
    assert df["kl_action"].tolist() == pytest.approx(TRAIN["train/kl_action"])
    assert read_live_metrics(inputs["warmup"])["value_loss"].tolist() == [2.0, 1.0, 0.5]
    assert read_live_metrics(inputs["root"] / "nowhere").empty


def test_comparison_table_union_intervals_and_delta(inputs: dict[str, Path]) -> None:
    zs = metrics_by_task(fake_episodes("goto", 0, 20) + fake_episodes("pickup", 2, 8),
                         ["goto", "pickup"])
    fin = metrics_by_task(fake_episodes("goto", 18, 20) + fake_episodes("open", 3, 4),
                          ["goto", "open"])
    rows = {r["task"]: r for r in comparison_table(zs, fin)}
    assert list(rows) == ["goto", "pickup", "open", "overall"]
    goto = rows["goto"]
    assert (goto["final_low"], goto["final_high"]) == pytest.approx(wilson_interval(18, 20))
    assert goto["delta"] == pytest.approx(0.9) and goto["overlap"] is False
    assert rows["pickup"]["final_success"] is None and rows["pickup"]["delta"] is None
    assert rows["open"]["zero_shot_success"] is None and rows["open"]["final_episodes"] == 4
    assert rows["overall"]["zero_shot_episodes"] == 28 and rows["overall"]["final_successes"] == 21
    assert rows["goto"]["final_valid_action_ratio"] == pytest.approx(0.8)


def test_report_table_numbers_and_reading(full_report: Path) -> None:
    text = full_report.read_text()
    assert "| goto | " + cell(0, 20) + " | " + cell(18, 20) + " | +0.90 |" in text
    assert "| pickup | " + cell(2, 8) + " | " + cell(3, 8) + " | +0.12 |" in text
    assert "| open | — | " + cell(3, 4) + " | — |" in text
    assert "| **overall** | " + cell(2, 28) + " | " + cell(24, 32) + " |" in text
    assert "no significant change at this sample size" in text  # pickup: intervals overlap
    assert "do not overlap" in text  # goto
    assert "ACTION KL rose faster than THINK KL" in text
    assert "- **model.source**: tiny" in text and "- **env.tasks**: goto, pickup" in text
    for png in PLOTS:
        assert f"]({png})" in text
    assert "not logged: " in text and "episode_length" in text  # keys the fake run never logged


def test_report_pngs_are_real_pngs(full_report: Path) -> None:
    for png in PLOTS:
        data = (full_report.parent / png).read_bytes()
        assert data[:8] == PNG_MAGIC, png
        assert len(data) > 5_000, png
    assert not list(full_report.parent.glob(".*tmp*"))  # atomic writes leave no temp files


def test_missing_train_and_warmup_still_report(inputs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "report"
    (out).mkdir()
    (out / "curves.png").write_bytes(PNG_MAGIC)  # stale plot from an earlier run
    path = build_report(inputs["zero_shot"], inputs["final"], tmp_path / "no_train",
                        tmp_path / "no_warmup", out, {})
    text = path.read_text()
    assert "training metrics (no DVCLive metrics in" in text
    assert "critic warm-up metrics (no DVCLive metrics in" in text
    assert "](curves.png)" not in text and "](warmup.png)" not in text
    assert "](tasks.png)" in text
    assert not (out / "curves.png").exists() and not (out / "kl.png").exists()


def test_nothing_at_all_still_reports(tmp_path: Path) -> None:
    path = build_report(tmp_path / "a", tmp_path / "b", tmp_path / "c", tmp_path / "d",
                        tmp_path / "out", {})
    text = path.read_text()
    assert "zero-shot evaluation" in text and "final evaluation" in text
    assert not list((tmp_path / "out").glob("*.png"))


def test_component_main_returns_zero(inputs: dict[str, Path], tmp_path: Path) -> None:
    from components.report import main

    params = tmp_path / "params.yaml"
    params.write_text("model: {source: tiny-model}\nenv: {name: babyai, tasks: [goto]}\n"
                      "eval: {tasks: [goto, pickup], episodes_per_task: 20}\n")
    out = tmp_path / "report"
    rc = main(["--params", str(params), "--zero-shot", str(inputs["zero_shot"]),
               "--final", str(inputs["final"]), "--train-live", str(tmp_path / "none"),
               "--warmup-live", str(inputs["warmup"]), "--out", str(out)])
    assert rc == 0
    text = (out / "report.md").read_text()
    assert "tiny-model" in text and "- **eval.episodes_per_task**: 20" in text
    assert (out / "warmup.png").read_bytes()[:8] == PNG_MAGIC


def test_kl_reading_needs_a_real_gap() -> None:
    """A rise of a thousandth of a nat more on ACTION tokens is not flagged as action hacking."""
    import pandas as pd

    from longturn.report import kl_reading

    small = pd.DataFrame({"kl_think": [0.0, 0.0009], "kl_action": [0.0, 0.0011]})
    assert "too small to read as action hacking" in kl_reading(small)[0]
    big = pd.DataFrame({"kl_think": [0.0, 0.01], "kl_action": [0.0, 0.05]})
    assert "check the outputs for action hacking" in kl_reading(big)[0]
    down = pd.DataFrame({"kl_think": [0.0, 0.02], "kl_action": [0.0, 0.01]})
    assert "no sign of action hacking" in kl_reading(down)[0]
