"""The report stage on synthetic inputs: real eval metrics and episodes, real DVCLive folders."""

from __future__ import annotations

import contextlib
from fractions import Fraction
from math import comb
from pathlib import Path

import pandas as pd
import pytest

from longturn.atomic import write_json
from longturn.run.evaluation import metrics_by_task
from longturn.report.build import build_report, comparison_table, read_live_metrics
from longturn.report.training import action_reading, pool_success_blocks, timing_reading
from longturn.stats import wilson_interval

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ["curves.png", "tasks.png", "kl.png", "warmup.png", "success.png", "timing.png",
         "actions.png"]
SEED = 1000  # eval.seed: episode i of every task plays seed SEED + i, in both evaluations


def fake_episodes(task: str, wins: int, n: int, first_win: int = 0, length: int = 10,
                  valid: int = 8) -> list[dict]:
    """n episodes on seeds SEED + i; those with first_win <= i < first_win + wins succeed."""
    out = []
    for i in range(n):
        won = first_win <= i < first_win + wins
        out.append({"task": task, "episode_seed": SEED + i, "episode_id": f"eval-{task}-{i}",
                    "success": won, "length": length, "return": float(won),
                    "env_return": float(won), "valid_actions": valid, "aborted": False,
                    "terminated": won, "truncated": not won})
    return out


def write_eval(folder: Path, counts: dict[str, tuple[int, int, int]]) -> dict:
    """metrics.json and episodes.parquet of one evaluation; counts: task -> (wins, n, first_win)."""
    episodes = [e for t, (w, n, first) in counts.items() for e in fake_episodes(t, w, n, first)]
    metrics = metrics_by_task(episodes, list(counts))
    write_json(folder / "metrics.json", metrics)
    pd.DataFrame(episodes).to_parquet(folder / "episodes.parquet")
    return metrics


def write_live(root: Path, live_dir: str, series: dict[str, list[float]]) -> Path:
    """Log like the train stage does: Live(dir, save_dvc_exp=False), log_metric, next_step;
    a NaN is not logged, as MetricsLog leaves it out."""
    from dvclive import Live

    with contextlib.chdir(root):  # Live writes a dvc.yaml next to the CWD: keep it in tmp
        live = Live(dir=live_dir, save_dvc_exp=False)
        for step in range(len(next(iter(series.values())))):
            for key, values in series.items():
                if values[step] == values[step]:
                    live.log_metric(key, values[step])
            live.next_step()
        live.end()
    return root / live_dir


ITERATIONS = 40
ENDED = [1 + i % 3 for i in range(ITERATIONS)]  # 1-3 episodes end per iteration: 79 in all
WINS = [e if i >= 20 else int(i % 4 == 0) for i, e in enumerate(ENDED)]
MIX = {"go_forward": [0.4] * (ITERATIONS - 1) + [0.9], "turn_left": [0.3] * (ITERATIONS - 1)
       + [0.05], "turn_right": [0.3] * (ITERATIONS - 1) + [0.05]}


def ramp(a: float, b: float) -> list[float]:
    return [a + (b - a) * i / (ITERATIONS - 1) for i in range(ITERATIONS)]


TRAIN = {"train/episodes_ended": [float(e) for e in ENDED],
         "train/successes": [float(w) for w in WINS],
         "train/success_rate": [w / e for w, e in zip(WINS, ENDED)],
         "train/mean_reward": ramp(0.0, 0.4), "train/kl_think": ramp(0.0, 0.02),
         "train/kl_action": ramp(0.0, 0.12), "train/value_loss": ramp(1.0, 0.4),
         "train/explained_variance": ramp(-0.2, 0.3), "train/entropy": ramp(2.0, 1.8),
         "train/lr_actor": ramp(1e-6, 1e-5), "train/lr_critic": [1e-5] * ITERATIONS,
         "train/epochs_run": [2.0] * ITERATIONS, "train/turns_per_s": ramp(20.0, 30.0),
         "train/seconds_rollout": [6.0] * ITERATIONS, "train/seconds_scoring": [1.0] * ITERATIONS,
         "train/seconds_update": [2.0] * ITERATIONS, "train/seconds_sync": [1.0] * ITERATIONS,
         "train/seconds_checkpoint": [float("nan")] * (ITERATIONS - 1) + [10.0],  # last only
         "train/seconds_per_iteration": [10.0] * (ITERATIONS - 1) + [20.0],
         **{f"train/action_mix/{name}": v for name, v in MIX.items()}}
WARMUP = {"warmup/value_loss": [2.0, 1.0, 0.5]}
# pickup: zero-shot wins seeds 0-9, final wins 5-24 -> 5 both, 5 lost, 15 gained, 5 neither
ZERO_SHOT = {"goto": (0, 20, 0), "pickup": (10, 30, 0)}
FINAL = {"goto": (18, 20, 0), "pickup": (20, 30, 5), "open": (3, 4, 0)}


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


def two_sided(lost: int, gained: int) -> float:
    """Exact McNemar p by hand: 2 · P(X ≤ min) for X ~ Bin(lost + gained, 1/2)."""
    n = lost + gained
    return float(min(1, 2 * sum(Fraction(comb(n, k), 2**n) for k in range(min(lost, gained) + 1))))


def test_read_live_metrics_one_row_per_step_without_namespace(inputs: dict[str, Path]) -> None:
    df = read_live_metrics(inputs["train"])
    assert list(df.index) == list(range(ITERATIONS))
    assert set(df.columns) == {k.split("/", 1)[1] for k in TRAIN}
    assert df["kl_action"].tolist() == pytest.approx(TRAIN["train/kl_action"])
    assert df["action_mix/go_forward"].iloc[-1] == pytest.approx(0.9)
    assert read_live_metrics(inputs["warmup"])["value_loss"].tolist() == [2.0, 1.0, 0.5]
    assert read_live_metrics(inputs["root"] / "nowhere").empty


def test_comparison_table_union_intervals_and_delta() -> None:
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
    assert two_sided(0, 18) == pytest.approx(7.63e-6, rel=1e-3)
    assert two_sided(5, 15) == pytest.approx(0.0414, rel=1e-3)
    assert two_sided(5, 33) == pytest.approx(4.26e-6, rel=1e-3)
    assert ("| goto | " + cell(0, 20) + " | " + cell(18, 20) + " | +0.90 | "
            "0 / 18 of 20, p = 7.6e-06 |") in text
    assert ("| pickup | " + cell(10, 30) + " | " + cell(20, 30) + " | +0.33 | "
            "5 / 15 of 30, p = 0.041 |") in text
    assert "| open | — | " + cell(3, 4) + " | — | — |" in text
    assert ("| **overall** | " + cell(10, 50) + " | " + cell(41, 54) + " | +0.56 | "
            "5 / 33 of 50, p = 4.3e-06 |") in text
    assert ("Paired on 20 seeds: 0 lost, 18 gained, exact McNemar p = 7.6e-06: the final policy "
            "is better, significant at 0.01.") in text
    # pickup: the Wilson intervals overlap, yet the paired test sees the change
    assert "Δ +0.33, the 95% intervals overlap (30 vs 30 episodes)" in text
    assert ("Paired on 30 seeds: 5 lost, 15 gained, exact McNemar p = 0.041: the final policy is "
            "better, significant at 0.05 (not at 0.01).") in text
    assert "No seed was played by both evaluations" in text  # open: final only
    assert "Unpaired episodes (played by one evaluation only): 0 zero-shot, 4 final." in text
    assert "could not be computed" not in text
    assert "do not overlap" in text  # goto
    assert "ACTION KL rose faster than THINK KL" in text
    # how they ended: a column for each reason that ended an episode (none failed or aborted)
    assert "| task | evaluation | success | time limit | success rate over |" in text
    assert "| goto | final | 18 | 2 | 20 of 20 episodes |" in text
    assert "lost" not in text.split("## How episodes ended")[1].split("##")[0]  # none aborted
    assert "- **model.source**: tiny" in text and "- **env.tasks**: goto, pickup" in text
    for png in PLOTS:
        assert f"]({png})" in text


def test_report_training_readings(full_report: Path) -> None:
    text = full_report.read_text()
    assert "## Training success (pooled)" in text
    blocks = pool_success_blocks(read_live_metrics(full_report.parent.parent / "train/live"))
    first, last = blocks[0], blocks[-1]
    assert (f"iterations {first.first_iteration}–{first.last_iteration}: "
            f"{first.successes}/{first.episodes} = {first.rate:.2f}") in text
    assert f"{last.successes}/{last.episodes} = 1.00 [{last.low:.2f}, 1.00]" in text
    assert "the 95% intervals do not overlap: success went up" in text
    assert "success rate:" not in text  # per-iteration success is not read when it can be pooled
    # 40 iterations of 6 + 1 + 2 + 1 s plus one 10 s checkpoint: rollout 240 of 410 s
    assert "rollout 6.0 s (59%)" in text
    assert "checkpoint 10.0 s (2%, in 1 of 40 iterations)" in text
    assert "median 25.0 turns/s" in text
    assert "Action collapse: “go forward” takes 90% of the turns in the last iteration (39)" in text
    missing = text.split("## Missing inputs")[1]
    assert "episode_length" in missing and "logprob_gap" in missing  # never logged by the fake run
    assert "peak_gpu_memory_gib" not in missing  # a CPU run has no GPU memory to report
    assert "action_mix" not in missing and "seconds_" not in missing


def test_report_pngs_are_real_pngs(full_report: Path) -> None:
    for png in PLOTS:
        data = (full_report.parent / png).read_bytes()
        assert data[:8] == PNG_MAGIC, png
        assert len(data) > 5_000, png
    assert not list(full_report.parent.glob(".*tmp*"))  # atomic writes leave no temp files


@pytest.mark.parametrize("damage", ["missing", "garbage", "no_seed"])
def test_unusable_episodes_file_still_reports_why(inputs: dict[str, Path], tmp_path: Path,
                                                  damage: str) -> None:
    final = tmp_path / "final"
    write_eval(final, FINAL)
    episodes = final / "episodes.parquet"
    if damage == "missing":
        episodes.unlink()
    elif damage == "garbage":
        episodes.write_bytes(b"not a parquet file")
    else:
        pd.read_parquet(episodes).drop(columns="episode_seed").to_parquet(episodes)
    path = build_report(inputs["zero_shot"], final, tmp_path / "no_train", tmp_path / "no_warmup",
                        tmp_path / "report", {})
    text = path.read_text()
    why = {"missing": "is missing", "garbage": "could not be read",
           "no_seed": "has no column episode_seed"}[damage]
    assert f"The paired McNemar test could not be computed: `{episodes}` {why}" in text
    assert f"paired episodes: `{episodes}` {why}" in text.split("## Missing inputs")[1]
    assert "| goto | " + cell(0, 20) + " | " + cell(18, 20) + " | +0.90 | — |" in text
    assert "Paired on" not in text


def test_training_without_timing_or_actions_says_so(tmp_path: Path) -> None:
    live = write_live(tmp_path, "live", {"train/success_rate": [0.0, 1.0, 0.5],
                                         "train/mean_reward": [0.0, 0.1, 0.2]})
    out = tmp_path / "report"
    out.mkdir()
    (out / "timing.png").write_bytes(PNG_MAGIC)  # stale plot from an earlier run
    text = build_report(tmp_path / "a", tmp_path / "b", live, tmp_path / "c", out, {}).read_text()
    assert "*No plot: none of seconds_rollout, seconds_scoring" in text
    assert "## Action mix" not in text  # no reply was parsed into an action: no section
    assert "## KL to the reference\n\n*kl_mean was not logged.*" in text
    assert "*No plot: no episode counts to pool" in text
    assert "- success rate: 0.000 → 0.500 over 3 iteration(s)" in text  # nothing to pool
    assert "action_mix" not in text.split("## Missing inputs")[1]  # a chat run logs none
    assert "](curves.png)" in text
    for png in ("timing.png", "actions.png", "success.png"):
        assert not (out / png).exists() and f"]({png})" not in text


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
    assert "](tasks.png)" in text and "Paired on 20 seeds" in text
    assert not (out / "curves.png").exists() and not (out / "kl.png").exists()


def test_critic_free_run_expects_no_warmup_and_no_value_metrics(inputs: dict[str, Path],
                                                                 tmp_path: Path) -> None:
    path = build_report(inputs["zero_shot"], inputs["final"], inputs["train"],
                        tmp_path / "no_warmup", tmp_path / "report", {}, critic=False)
    text = path.read_text()
    assert "No critic: the estimator compares episodes" in text
    assert "critic warm-up metrics" not in text and "value_loss" not in text.split("## Missing")[1]


def test_nothing_at_all_still_reports(tmp_path: Path) -> None:
    path = build_report(tmp_path / "a", tmp_path / "b", tmp_path / "c", tmp_path / "d",
                        tmp_path / "out", {})
    text = path.read_text()
    assert "zero-shot evaluation" in text and "final evaluation" in text
    assert f"`{tmp_path / 'a' / 'episodes.parquet'}` is missing" in text
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


# --------------------------------------------------------------------------- pure readings

def test_pooling_few_episodes_per_iteration() -> None:
    df = pd.DataFrame({"episodes_ended": ENDED, "successes": WINS})
    blocks = pool_success_blocks(df)
    assert 5 <= len(blocks) <= 10
    assert all(b.episodes >= 10 for b in blocks)
    assert sum(b.episodes for b in blocks) == sum(ENDED) == 79
    assert sum(b.successes for b in blocks) == sum(WINS)
    assert blocks[0].first_iteration == 0 and blocks[-1].last_iteration == ITERATIONS - 1
    for before, after in zip(blocks, blocks[1:]):
        assert after.first_iteration == before.last_iteration + 1  # contiguous, no overlap
    for b in blocks:
        span = range(b.first_iteration, b.last_iteration + 1)
        assert b.episodes == sum(ENDED[i] for i in span)
        assert b.successes == sum(WINS[i] for i in span)
        assert b.iteration == pytest.approx(sum(span) / len(span))
        assert (b.low, b.high) == pytest.approx(wilson_interval(b.successes, b.episodes))
        assert b.rate == b.successes / b.episodes
    first = blocks[0]  # iterations 0-5: ended 1,2,3,1,2,3 = 12; wins at 0 and 4 (1 each)
    assert (first.last_iteration, first.episodes, first.successes) == (5, 12, 2)
    assert (first.low, first.high) == pytest.approx((0.0470, 0.4480), abs=1e-4)


def test_pooling_merges_a_short_tail_and_reads_old_runs() -> None:
    """21 iterations of 1 episode: blocks of 10, the 1-episode tail joins the last block.
    Without `successes` (an older run) the count is rebuilt from success_rate."""
    df = pd.DataFrame({"episodes_ended": [1.0] * 21, "success_rate": [1.0, 0.0, 0.0] * 7})
    blocks = pool_success_blocks(df)
    assert [(b.first_iteration, b.last_iteration, b.episodes) for b in blocks] == [
        (0, 9, 10), (10, 20, 11)]
    assert [b.successes for b in blocks] == [4, 3]


def test_pooling_skips_iterations_without_ended_episodes() -> None:
    df = pd.DataFrame({"episodes_ended": [0.0, 4.0, float("nan"), 3.0],
                       "success_rate": [float("nan"), 0.5, float("nan"), 1.0]})
    (only,) = pool_success_blocks(df)  # 7 < 10 episodes in all: one block, said as such
    assert (only.first_iteration, only.last_iteration) == (1, 3)
    assert (only.episodes, only.successes) == (7, 5)
    assert pool_success_blocks(pd.DataFrame({"success_rate": [0.5]})) == []
    assert pool_success_blocks(pd.DataFrame()) == []


def test_timing_reading_medians_and_shares() -> None:
    df = pd.DataFrame({"seconds_rollout": [1.0, 2.0, 3.0], "seconds_update": [3.0, 3.0, 3.0]})
    (line,) = timing_reading(df)
    assert "rollout 2.0 s (40%)" in line and "update 3.0 s (60%)" in line
    assert "scoring" not in line and "turns/s" not in line and "iterations" not in line
    df["seconds_checkpoint"] = [float("nan"), float("nan"), 5.0]
    assert "checkpoint 5.0 s (25%, in 1 of 3 iterations)" in timing_reading(df)[0]
    assert timing_reading(pd.DataFrame({"turns_per_s": [3.0]})) == []


def test_action_reading_flags_collapse_only_at_the_threshold() -> None:
    mix = pd.DataFrame({"action_mix/go_forward": [0.2, 0.79], "action_mix/pick_up": [0.8, 0.21]})
    (line,) = action_reading(mix)
    assert line.startswith("No collapse: “go forward”, the most frequent action, takes 79%")
    mix.loc[1] = [0.2, 0.8]
    assert action_reading(mix)[0].startswith("Action collapse: “pick up” takes 80%")
    assert action_reading(pd.DataFrame({"entropy": [1.0]})) == []


def test_kl_reading_needs_a_real_gap() -> None:
    """A rise of a thousandth of a nat more on ACTION tokens is not flagged as action hacking."""
    from longturn.report.build import kl_reading

    small = pd.DataFrame({"kl_think": [0.0, 0.0009], "kl_action": [0.0, 0.0011]})
    assert "too small to read as action hacking" in kl_reading(small)[0]
    big = pd.DataFrame({"kl_think": [0.0, 0.01], "kl_action": [0.0, 0.05]})
    assert "check the outputs for action hacking" in kl_reading(big)[0]
    down = pd.DataFrame({"kl_think": [0.0, 0.02], "kl_action": [0.0, 0.01]})
    assert "no sign of action hacking" in kl_reading(down)[0]


# --------------------------------------------------------------------------- how episodes ended

def test_aborted_episodes_are_counted_apart_in_the_report(tmp_path: Path) -> None:
    """Final goto: 18 of 20 seeds played (6 wins), 2 lost to the env (one error, one timeout);
    zero-shot goto: the same 20 seeds, 2 wins. The aborted seeds are outside the success rate
    and unpaired; the endings table and the training line say how episodes ended."""
    zs = fake_episodes("goto", 2, 20)
    fin = fake_episodes("goto", 6, 20, first_win=2)
    for episode, reason in zip(fin[18:], ("env_error", "timeout")):
        episode.update(aborted=True, success=False, termination=reason, length=1)
    for e in zs + fin:
        e.setdefault("termination", None)
        e.update(terminated=e["success"], truncated=not e["success"] and not e["aborted"])
    for name, episodes in (("zero_shot", zs), ("final", fin)):
        write_json(tmp_path / name / "metrics.json", metrics_by_task(episodes, ["goto"]))
        frame = pd.DataFrame(episodes).drop(columns="termination")  # not a Parquet column
        frame.to_parquet(tmp_path / name / "episodes.parquet")
    live = write_live(tmp_path, "live", {
        "train/episodes_ended": [3.0, 4.0], "train/episodes_aborted": [0.0, 2.0],
        "train/successes": [1.0, 1.0], "train/termination/success": [1.0, 1.0],
        "train/termination/failure": [0.0, 0.0], "train/termination/time_limit": [2.0, 1.0],
        "train/termination/env_error": [0.0, 1.0], "train/termination/timeout": [0.0, 1.0]})
    text = build_report(tmp_path / "zero_shot", tmp_path / "final", live, tmp_path / "w",
                        tmp_path / "report", {}).read_text()
    assert "| goto | " + cell(2, 20) + " | " + cell(6, 18) + " |" in text
    assert "| goto | final | 6 | 12 | 1 | 1 | 18 of 20 episodes |" in text
    assert "| goto | zero-shot | 2 | 18 | 0 | 0 | 20 of 20 episodes |" in text
    assert ("The final evaluation lost 2 of 20 episodes to the env (1 env error, 1 timeout)"
            in text)
    assert "Paired on 18 seeds" in text  # the two aborted seeds are unpaired, not failures
    assert ("- training: 7 episodes ended over 2 iteration(s): success 2, time limit 3, env error "
            "1, timeout 1. 2 (29%) were aborted by the env (at most 2 in one "
            "iteration, iteration 1)") in text
    blocks = pool_success_blocks(read_live_metrics(live))
    assert [(b.episodes, b.successes) for b in blocks] == [(5, 2)]  # aborted ones left out


def test_old_metrics_without_termination_counts_say_so(inputs: dict[str, Path],
                                                       tmp_path: Path) -> None:
    import json

    for name in ("zero_shot", "final"):
        metrics = json.loads((inputs[name] / "metrics.json").read_text())
        for part in [metrics["overall"], *metrics["tasks"].values()]:
            for key in [k for k in part if k.startswith("termination/")]:
                del part[key]
        write_json(tmp_path / name / "metrics.json", metrics)
    text = build_report(tmp_path / "zero_shot", tmp_path / "final", tmp_path / "t",
                        tmp_path / "w", tmp_path / "report", {}).read_text()
    assert "*No termination counts in the inputs" in text


def test_one_eval_table_for_every_protocol(full_report: Path) -> None:
    """An episode's length is its replies, and a reply is valid when it parsed into an action or
    its tool calls ran (run/evaluation.py): one pair of column names, whatever the protocol."""
    head = next(line for line in full_report.read_text().splitlines()
                if line.startswith("| task |"))
    assert "| replies per episode (zero-shot → final) | valid replies (zero-shot → final) |" \
        in head


def test_replies_per_episode_is_pooled_as_success_is(tmp_path: Path) -> None:
    """Envs that start together end their short (successful) episodes first and hit the time
    limit together, so per iteration the length swings 3 → 15 → 3 → 15 (a GPU run of
    2026-11-28 read 3.17 → 15.45 while its evaluations went 15.0 → 14.2); weighted by the
    episodes each iteration ended, both blocks say the same."""
    live = write_live(tmp_path, "live", {
        "train/episodes_ended": [1, 100, 1, 100], "train/successes": [1, 10, 1, 10],
        "train/episode_length": [3.0, 15.0, 3.0, 15.0]})
    text = build_report(tmp_path / "a", tmp_path / "b", live, tmp_path / "c",
                        tmp_path / "report", {}).read_text()
    pooled = (1 * 3.0 + 100 * 15.0) / 101
    assert (f"- replies per episode, over the episodes ended in the first and last success "
            f"blocks: {pooled:.2f} (iterations 0–1) → {pooled:.2f} (iterations 2–3).") in text
    assert "3.00 → 15.00" not in text


def test_a_chat_run_reads_as_replies_and_tool_calls_without_being_told(tmp_path: Path) -> None:
    """The report is not told the protocol: a run whose replies were never parsed into actions
    logged no action mix and no THINK / ACTION KL (NaN, left out), so it gets no such section,
    and its replies section reads the tool-call metrics it did log."""
    nan = float("nan")
    live = write_live(tmp_path, "live", {
        "train/episode_length": [3.0, 2.0], "train/tool_calls_per_episode": [2.0, 1.5],
        "train/tool_call_validity": [0.5, 0.9], "train/tokenization/identical": [4.0, 4.0],
        "train/kl_mean": [0.001, 0.004], "train/kl_think": [nan, nan],
        "train/kl_action": [nan, nan]})  # no ACTION tag: no split (algo/ppo_steps.py)
    text = build_report(tmp_path / "a", tmp_path / "b", live, tmp_path / "c",
                        tmp_path / "report", {}).read_text()
    assert "- replies per episode: 3.00 → 2.00 over 2 iteration(s)." in text
    assert "- tool calls per episode: 2.00 → 1.50" in text
    assert "- tool calls that did not fail: 0.50" in text
    assert "- tokenization check over the run's episodes: identical 8" in text
    assert "## Action mix" not in text and "THINK" not in text
    kl = "## KL to the reference\n\n- KL(π‖π_ref) per sampled token: 0.0010 → 0.0040"
    assert kl in text
    assert not (tmp_path / "report" / "kl.png").exists()
