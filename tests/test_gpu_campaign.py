"""The GPU campaign, everything of it that runs without a GPU: the profiles it proves (merged and
validated, sized in their headers), the trace analysis on a hand-built CUDA trace, the GPU
sampler on nvidia-smi's output format, the budget, and the whole command in its tiny mode
(every part on the CPU, resumed, packed and kept as evidence)."""

from __future__ import annotations

import gzip
import json
import os
import re
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from longturn.params.config import ParamsError, parse_params
from longturn.params.profiles import load_profile, merge, resolve_profile

ROOT = Path(__file__).resolve().parents[1]
CAMPAIGN_PROFILES = ("gpu1", "lease15", "babyai5", "grpo", "gigpo", "calculator",
                     "calculator_window_gpu", "babaisai")
PROFILES = [ROOT / "configs" / "profiles" / f"{name}.yaml" for name in CAMPAIGN_PROFILES]
sys.path.insert(0, str(ROOT / "bench"))

from campaign import archive, profile_report, results as campaign_results, summary  # noqa: E402
from campaign.gpu_sampler import read_samples, window_means  # noqa: E402
from campaign.imports import missing_modules, stage_scripts  # noqa: E402
from campaign.stages import (BUDGET_SPENT, STALLED, Stage, learning_stages,  # noqa: E402
                             run_stage)
from campaign.trace import Trace, analyse  # noqa: E402


def load_campaign():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_campaign", ROOT / "bench/gpu_campaign.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# ---- the profiles ----------------------------------------------------------------------------

def test_the_issue_s_profiles_are_all_there():
    assert load_campaign().CAMPAIGN_PROFILES == CAMPAIGN_PROFILES
    assert all(path.is_file() for path in PROFILES)


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_profile_validates_pairs_its_seeds_and_states_its_sizing(path):
    params = load_profile(path)
    assert params.engine.device == "cuda"  # a GPU profile fails at once on a CPU
    assert params.eval.episodes_per_task >= 128  # paired McNemar on at least 128 seeds per task
    assert set(params.eval.tasks) <= set(params.env.tasks)
    header = "\n".join(line for line in path.read_text().splitlines() if line.startswith("#"))
    assert "Sizing" in header and "Not runnable here" in header
    minutes = [float(m) for m in re.findall(r"= (\d+(?:\.\d+)?) min", header)]
    assert minutes and max(minutes) <= 25, f"{path.name}: no sizing total within 25 minutes"
    # the campaign's tiny mode can run every profile: same keys at toy size, still valid
    campaign = load_campaign()
    parse_params(campaign.tiny_params(resolve_profile(path), "/tmp/model"), path.name)


def test_estimator_profiles_change_only_the_estimator_and_length():
    gpu1 = resolve_profile(ROOT / "configs/profiles/gpu1.yaml")
    for name in ("grpo", "gigpo"):
        other = resolve_profile(ROOT / f"configs/profiles/{name}.yaml")
        assert other["algo"]["advantage"] == name
        assert {k for k in gpu1 if gpu1[k] != other[k]} == {"algo", "train"}
        assert other["eval"] == gpu1["eval"] and other["seed"] == gpu1["seed"]


def test_overlays_merge_mappings_replace_lists_and_env_kwargs(tmp_path):
    assert merge({"a": {"x": 1, "y": [1, 2]}, "b": 1}, {"a": {"y": [3]}}) == {
        "a": {"x": 1, "y": [3]}, "b": 1}
    assert merge({"env": {"kwargs": {"num_dists": 0}, "name": "babyai"}},
                 {"env": {"kwargs": {}}}) == {"env": {"kwargs": {}, "name": "babyai"}}
    (tmp_path / "sub").mkdir()
    (tmp_path / "base.yaml").write_text("seed: 1\ntrain: {iterations: 7}\n")
    (tmp_path / "sub/mid.yaml").write_text("extends: ../base.yaml\ntrain: {checkpoint_every: 2}\n")
    (tmp_path / "top.yaml").write_text("extends: sub/mid.yaml\nseed: 3\n")
    params = load_profile(tmp_path / "top.yaml")
    assert (params.seed, params.train.iterations, params.train.checkpoint_every) == (3, 7, 2)
    (tmp_path / "loop.yaml").write_text("extends: loop.yaml\n")
    with pytest.raises(ParamsError, match="loops back"):
        resolve_profile(tmp_path / "loop.yaml")
    (tmp_path / "bad.yaml").write_text("extends: base.yaml\ntrain: {iteratons: 3}\n")
    with pytest.raises(ParamsError, match=r"bad.yaml: unknown key 'train.iteratons'"):
        load_profile(tmp_path / "bad.yaml")


# ---- the trace analysis ----------------------------------------------------------------------

def _x(cat, name, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1,
            "args": args}


def cuda_trace() -> list[dict]:
    """One update phase of 1,000 µs with two micro-batches; the first launches two kernels and
    never waits, the second launches one kernel and syncs once (an `.item()`)."""
    return [
        _x("user_annotation", "phase/update", 0, 1000),
        _x("user_annotation", "update/micro_batch", 100, 300),
        _x("cuda_runtime", "cudaLaunchKernel", 110, 5, correlation=1),
        _x("cuda_runtime", "cudaLaunchKernel", 120, 5, correlation=2),
        _x("kernel", "gemm", 150, 100, correlation=1),
        _x("kernel", "gemm", 200, 100, correlation=2),       # overlaps the first: busy 150
        _x("user_annotation", "update/micro_batch", 500, 400),
        _x("cuda_runtime", "cudaLaunchKernel", 510, 5, correlation=3),
        _x("kernel", "softmax", 520, 50, correlation=3),
        _x("cuda_runtime", "cudaMemcpyAsync", 580, 5, correlation=4),
        _x("gpu_memcpy", "Memcpy DtoH", 585, 10, correlation=4),
        _x("cuda_runtime", "cudaStreamSynchronize", 590, 20),
        _x("cpu_op", "aten::item", 575, 40),
    ]


def test_trace_cut_along_phases_micro_batches_and_correlations(tmp_path):
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": cuda_trace()}, handle)
    (tmp_path / "phases.json").write_text(json.dumps(
        {"iteration": 1, "device": "cuda:0", "peak_gpu_memory_gib": {"update": 12.5}}))
    a = analyse(path, tmp_path / "phases.json")
    (update,) = a["phases"]
    assert update["name"] == "update" and update["wall_s"] == pytest.approx(1e-3)
    assert update["gpu_busy_s"] == pytest.approx((150 + 50 + 10) / 1e6)  # union, not the sum
    assert (update["kernels"], update["launches"], update["syncs"]) == (3, 3, 1)
    mb = a["ranges"]["update/micro_batch"]
    assert mb["count"] == 2 and mb["launches"] == 1.5 and mb["max_launches"] == 2
    assert mb["syncs"] == 0.5 and mb["max_syncs"] == 1
    assert mb["kernels"] == 1.5 and mb["gpu_ms"] == pytest.approx((200 + 50) / 2 / 1e3)
    assert [k["name"] for k in a["top"]] == ["gemm", "softmax", "Memcpy DtoH"]
    assert a["top"][0]["share"] == pytest.approx(200 / 260)
    page = profile_report.render(a, "python components/train.py", "kept whole")
    assert "Largest phase: **update**" in page and "| update micro-batch | 2 |" in page
    assert "12.50" in page and "`gemm`" in page


def test_trace_is_cut_to_fit_the_archive(tmp_path):
    events = cuda_trace() + [_x("cpu_op", f"aten::op{i}", 600 + i, 1) for i in range(20000)]
    source = tmp_path / "big.json.gz"
    with gzip.open(source, "wt", compresslevel=0) as handle:
        json.dump({"traceEvents": events}, handle)
    limit = 4000
    note = profile_report.keep_trace(source, tmp_path / "kept.json.gz", limit)
    kept = tmp_path / "kept.json.gz"
    assert kept.stat().st_size <= limit and "CPU ops left out" in note
    assert {e["cat"] for e in Trace(
        json.loads(gzip.decompress(kept.read_bytes()))["traceEvents"]).events} >= {"kernel"}


def test_gpu_samples_are_read_in_nvidia_smi_format(tmp_path):
    csv = tmp_path / "gpu.csv"
    csv.write_text("2026/11/24 10:00:00.100, 40, 1000\n2026/11/24 10:00:01.100, 80, 3000\n"
                   "2026/11/24 10:00:02.1")  # a row cut short by the kill
    samples = read_samples(csv)
    assert [s[1] for s in samples] == [40.0, 80.0]
    means = window_means(samples, samples[0][0], samples[1][0])
    assert means == {"utilization_mean": 60.0, "memory_peak_mib": 3000.0, "samples": 2}
    assert window_means(samples, 0, 1) is None


def test_archive_leaves_out_the_biggest_files_to_fit(tmp_path):
    results = tmp_path / "results"
    (results / "logs").mkdir(parents=True)
    (results / "summary.md").write_text("# s\n")
    (results / "trace.json.gz").write_bytes(os.urandom(20000))
    (results / "logs/train.log").write_text("x\n")
    left = archive.pack(results, tmp_path / "2026-01-01-gpu1.tgz", limit=8000)
    assert left == ["trace.json.gz"]
    with tarfile.open(tmp_path / "2026-01-01-gpu1.tgz") as tar:
        assert "2026-01-01-gpu1/summary.md" in tar.getnames()


def test_no_time_left_stops_before_any_part_with_a_summary(tmp_path, monkeypatch):
    campaign = load_campaign()
    monkeypatch.setattr(sys, "argv", ["gpu_campaign.py", "--tiny", "--out", str(tmp_path)])
    run = campaign.Campaign(campaign.parse_args())
    run.deadline = time.time()  # spent
    assert run.run() == campaign.EXIT_BUDGET
    summary = (tmp_path / "results/summary.md").read_text()
    assert "stopped at the budget before environment" in summary
    assert (tmp_path / f"{run.name}.tgz").is_file()


def test_a_part_the_budget_stops_is_named_as_stopped_during_it(tmp_path, monkeypatch):
    campaign = load_campaign()
    monkeypatch.setattr(sys, "argv", ["gpu_campaign.py", "--tiny", "--out", str(tmp_path)])
    run = campaign.Campaign(campaign.parse_args())
    monkeypatch.setattr(run, "tiny_model", lambda: "/tmp/model")
    monkeypatch.setattr(run, "imports", lambda stages: "done")  # its own tests are above

    def stage(stage, extra):
        if stage.name == "critic_warmup":
            raise campaign.BudgetSpent(stage.name)  # what a stage killed at the budget raises
        return "done"

    monkeypatch.setattr(run, "stage", stage)
    monkeypatch.setattr(run, "run_engine_bench", lambda argv: "done")
    assert run.run() == campaign.EXIT_BUDGET
    summary = (tmp_path / "results/summary.md").read_text()
    assert "stopped at the budget during critic_warmup" in summary


def test_the_trace_analysis_runs_under_the_budget_and_the_campaign_still_ends(tmp_path,
                                                                              monkeypatch):
    """On 2026-11-29 the analysis of an H200 iteration's trace (150 MB gzipped) ran past the
    budget in the campaign's own process: no summary, no archive. It is a child process now."""
    campaign = load_campaign()
    monkeypatch.setattr(sys, "argv", ["gpu_campaign.py", "--tiny", "--out", str(tmp_path)])
    run = campaign.Campaign(campaign.parse_args())
    monkeypatch.setattr(run, "tiny_model", lambda: "/tmp/model")
    monkeypatch.setattr(run, "imports", lambda stages: "done")
    monkeypatch.setattr(run, "run_engine_bench", lambda argv: "done")

    def stage(stage, extra):
        if stage.name == "train":
            (run.work / "profile").mkdir(parents=True)
            (run.work / "profile/trace.json.gz").write_bytes(b"")
        return "done"

    children = []

    def run_stage(stage, log, extra=None, timeout_s=None, stall_s=None):
        children.append((stage.argv, timeout_s))
        return campaign.BUDGET_SPENT, timeout_s

    monkeypatch.setattr(run, "stage", stage)
    monkeypatch.setattr(campaign, "run_stage", run_stage)
    assert run.run() == campaign.EXIT_BUDGET
    (argv, timeout_s), = children
    assert "--analyse-trace" in argv and argv[argv.index("--out") + 1] == str(tmp_path)
    assert 0 < timeout_s <= run.remaining() + 5
    summary = (tmp_path / "results/summary.md").read_text()
    assert "stopped at the budget during profile" in summary
    assert (tmp_path / f"{run.name}.tgz").is_file()


def test_a_short_lease_skips_the_engine_bench_and_the_profiled_iteration(tmp_path, monkeypatch):
    campaign = load_campaign()
    monkeypatch.setattr(sys, "argv", ["gpu_campaign.py", "--tiny", "--out", str(tmp_path),
                                      "--skip", "engine_throughput", "--skip", "profile"])
    run = campaign.Campaign(campaign.parse_args())
    monkeypatch.setattr(run, "tiny_model", lambda: "/tmp/model")
    monkeypatch.setattr(run, "imports", lambda stages: "done")  # its own tests are above
    commands = []
    monkeypatch.setattr(run, "stage", lambda stage, extra: commands.append(
        (stage.name, extra)) or "done")
    run.results_dir.mkdir(parents=True)
    run.work.mkdir()
    run.learning_run()
    assert [name for name, _ in commands][:2] == ["prepare_model", "validate_prompts"]
    assert set(run.state["parts"]) == {"environment", "imports"} | {name for name, _ in commands}
    train_extra = dict(commands)["train"]
    assert "--deadline" in train_extra and "--profile-iteration" not in train_extra


OPTIONAL_ON_A_NODE = ("aiohttp", "openai", "requests", "duckdb", "dvc", "kfp", "crafter")


STAGE_SCRIPTS = stage_scripts(learning_stages(Path("/w"), Path("/w/params.yaml")))


def test_every_stage_imports_on_a_node_without_the_endpoint_s_packages():
    """A GPU node carries only what the stages need: the agent endpoint's aiohttp once sat on
    every stage's import path and stopped the first H200 campaign at its second stage."""
    assert len(STAGE_SCRIPTS) == 7
    assert missing_modules(STAGE_SCRIPTS, absent=OPTIONAL_ON_A_NODE) == {}


def test_a_module_the_node_lacks_is_named_with_the_stages_it_stops():
    missing = missing_modules(STAGE_SCRIPTS, absent=("jsonschema",))
    assert list(missing) == ["jsonschema"]
    assert {Path(s).stem for s in missing["jsonschema"]} == {
        "validate_prompts", "zero_shot_eval", "critic_warmup", "train", "final_eval"}


def test_a_module_the_stage_scripts_own_check_finds_missing_is_named_too(tmp_path):
    """A node lacking what `components/python_check.py` checks stops there with one line (a
    SystemExit, not an import error); the probe still names the module."""
    check = (ROOT / "components/python_check.py").read_text()
    assert '_NEEDED = ("components", "longturn", "torch")' in check
    (tmp_path / "python_check.py").write_text(
        check.replace('"torch")', '"torch", "no_module_of_this_node")'))
    script = tmp_path / "stage.py"
    script.write_text("import python_check  # noqa: F401\n")
    assert missing_modules([str(script)]) == {"no_module_of_this_node": [str(script)]}


def test_a_silent_stage_is_stopped_as_hung_and_a_long_one_at_the_budget(tmp_path):
    silent = Stage("silent", [sys.executable, "-c",
                              "import subprocess, sys, time; print('ready', flush=True); "
                              "child = subprocess.Popen([sys.executable, '-c', "
                              "'import time; time.sleep(120)']); "
                              "print(child.pid, flush=True); time.sleep(120)"])
    code, seconds = run_stage(silent, tmp_path / "silent.log", stall_s=1.0)
    log = (tmp_path / "silent.log").read_text()
    assert code == STALLED and seconds < 60, log
    assert "no output for 1 s: taken for hung" in log
    child = int(log.splitlines()[2])
    time.sleep(0.5)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text()

    chatty = Stage("chatty", [sys.executable, "-c",
                              "import time\nwhile True: print('step', flush=True); "
                              "time.sleep(0.2)"])
    code, _ = run_stage(chatty, tmp_path / "chatty.log", timeout_s=1.0, stall_s=1.0)
    assert code == BUDGET_SPENT
    assert "the budget ran out after 1 s" in (tmp_path / "chatty.log").read_text()


def test_a_stage_that_finished_but_hangs_at_exit_is_stopped_and_the_campaign_goes_on(
        tmp_path, monkeypatch):
    """What the first H200 run needed: its critic warm-up wrote everything, then sat in NCCL's
    teardown for 433 s. A stage that printed its finished line is done; one that did not, failed."""
    campaign = load_campaign()
    monkeypatch.setattr(sys, "argv", ["gpu_campaign.py", "--tiny", "--out", str(tmp_path)])
    run = campaign.Campaign(campaign.parse_args())
    run.stall_s = 1.5
    hang = "import sys, time; print({!r}, file=sys.stderr, flush=True); time.sleep(120)"
    finished = Stage("critic_warmup", [sys.executable, "-c",
                                       hang.format("critic_warmup: finished in 85 s")])
    assert run.stage(finished) == "done"
    stuck = Stage("critic_warmup", [sys.executable, "-c", hang.format("refit 2/2")])
    assert run.stage(stuck).startswith("failed (hung: no output for 2 s")


# ---- the command, end to end -----------------------------------------------------------------

FAKE_NVIDIA_SMI = """#!/bin/sh
# stands in for nvidia-smi -l 1: one CSV row every 0.2 s until killed
while true; do echo "$(date '+%Y/%m/%d %H:%M:%S').000, 55, 1234"; sleep 0.2; done
"""


def test_tiny_campaign_runs_every_part_resumes_and_keeps_evidence(tmp_path, tiny_model_dir):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (bin_dir / "nvidia-smi").chmod(stat.S_IRWXU)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    out = tmp_path / "campaign"
    cmd = [sys.executable, "bench/gpu_campaign.py", "--tiny", "--tiny-dir", tiny_model_dir,
           "--profile", "gpu1", "--out", str(out), "--memory"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = out / "results"
    data = json.loads((results / "results.json").read_text())
    assert data["status"] == "finished"
    for key in ("environment", "engine_throughput", "evaluation", "training", "profile",
                "gpu_utilization", "goals"):
        assert key in data, key
    stages = ("prepare_model", "validate_prompts", "zero_shot_eval", "critic_warmup", "train",
              "final_eval", "report")
    assert [k for k in data["parts"] if k in stages] == list(stages)  # dvc.yaml's order
    assert all(p["status"] == "done" for p in data["parts"].values()), data["parts"]
    assert data["evaluation"]["goto"]["value"]["pairs"] == 2
    assert data["gpu_utilization"]["train"]["value"]["utilization_mean"] == 55.0
    assert "--deadline" in data["parts"]["train"]["command"]
    profile = (results / "profile.md").read_text()
    for section in ("## Phases", "## Per micro-batch and per decode step", "## The 20 costliest"):
        assert section in profile
    assert "| rollout |" in profile and "| update micro-batch |" in profile
    summary = (results / "summary.md").read_text()
    assert "| goto | 0/2" in summary or "| goto | 1/2" in summary or "| goto | 2/2" in summary
    assert "tool_use" not in data and "## Tool use" not in summary  # the action protocol
    assert isinstance(data["training"]["value"]["success_halves"], list)
    assert (results / "gpu_memory.md").is_file()
    assert (results / "learning/report/report.md").is_file()
    bundle = out / f"{time.strftime('%Y-%m-%d')}-gpu1-tiny.tgz"
    bundle = bundle if bundle.is_file() else next(out.glob("*-gpu1-tiny.tgz"))
    assert bundle.stat().st_size <= archive.LIMIT_BYTES

    # resumed, detached: the command returns at once and the campaign skips what it finished
    again = subprocess.run(cmd + ["--detach"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=60)
    assert again.returncode == 0 and "running detached" in again.stdout
    log = out / "campaign.log"
    for _ in range(300):
        if log.is_file() and "[campaign] finished" in log.read_text():
            break
        time.sleep(0.5)
    assert log.read_text().count("done in an earlier run, skipped") >= 10

    kept = archive.keep(bundle, tmp_path / "measurements")
    names = {p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file()}
    assert {"summary.md", "profile.md", "results.json", "learning/report/report.md"} <= names
    assert not any(n.endswith((".gz", ".log")) or n.startswith("logs/") for n in names)
    assert any(n.endswith(".png") for n in names)


def test_profile_errors_name_the_file(tmp_path):
    (tmp_path / "p.yaml").write_text("extends: missing.yaml\n")
    with pytest.raises(ParamsError, match="missing.yaml"):
        load_profile(tmp_path / "p.yaml")
    assert load_profile(ROOT / "configs/profiles/gpu1.yaml").warmup.iterations == 4


def test_training_success_is_pooled_over_episodes_not_averaged_over_iterations(tmp_path):
    """Envs that start together hit the time limit together, so the per-iteration rate swings
    (2026-11-28: 1.00, 0.07, 0.57, 0.03, ...); a mean of rates reads the swing, not the policy."""
    plots = tmp_path / "data/train/live/plots/metrics/train"  # what dvclive writes
    plots.mkdir(parents=True)
    ended, wins = [1, 100, 1, 100], [1, 10, 1, 10]
    columns = {"episodes_ended": ended, "successes": wins,
               "success_rate": [k / n for k, n in zip(wins, ended)],
               "seconds_per_iteration": [20.0] * 4, "turns_per_s": [50.0] * 4}
    for key, values in columns.items():
        (plots / f"{key}.tsv").write_text(
            f"step\t{key}\n" + "".join(f"{i}\t{v}\n" for i, v in enumerate(values)))
    figures = {"training": campaign_results.training(tmp_path, {"train": "python train.py"})}
    state = {"profile": "lease15", "parts": {}, "status": "finished", "command": "c",
             "budget_s": 780}
    text = summary.render(state, figures)
    assert "iterations 0–1: 11/101 = 0.11" in text and "iterations 2–3: 11/101 = 0.11" in text
    assert "0.55" not in text  # the mean of the four rates


def _eval_samples(path: Path, calls: list[int], wins: list[bool]) -> None:
    """An evaluation's turns.parquet as the chat protocol writes it, reduced to what the tool-use
    figures read: the sample that ends each episode carries its tool counts."""
    import pandas as pd

    path.mkdir(parents=True)
    rows = [{"task": "arithmetic", "episode_seed": 1000 + i, "tool_calls": c, "tool_errors": 0,
             "replies": [{"success": False}, {"success": w}]}
            for i, (c, w) in enumerate(zip(calls, wins))]
    pd.DataFrame(rows).to_parquet(path / "turns.parquet")


def test_tool_use_is_paired_on_seeds_for_the_chat_protocol_only(tmp_path):
    _eval_samples(tmp_path / "data/eval/zero_shot", [0, 0, 1, 0], [False, False, True, False])
    _eval_samples(tmp_path / "data/eval/final", [2, 1, 1, 0], [True, False, True, False])
    commands = {"zero_shot_eval": "zs", "final_eval": "fin"}
    assert campaign_results.tool_use(tmp_path, commands, "action") == {}
    figures = campaign_results.tool_use(tmp_path, commands, "chat")
    v = figures["value"]
    assert v["zero_shot"]["with_tool_call"] == 1 and v["final"]["with_tool_call"] == 3
    assert v["final"]["calls_per_episode"] == 1.0 and v["final"]["accuracy"] == 0.5
    assert (v["used_tool_paired"]["lost"], v["used_tool_paired"]["gained"]) == (0, 2)
    state = {"profile": "calculator", "parts": {}, "status": "finished", "command": "c",
             "budget_s": 780}
    assert "| episodes with a tool call | 1 | 3 |" in summary.render(state, {"tool_use": figures})
