"""One command for a GPU node: prove that a profile learns and find the bottleneck, in a budget.

Why: a GPU is at hand rarely and for about 30 minutes, with no network. Everything worth
measuring then runs from this one command, detached, tested beforehand on the CPU (--tiny), and
comes back as one archive of at most 16 MB. In order:

  1. environment  GPU, driver, torch and CUDA, bf16, free memory: one line (environment.txt)
  2. the learning run, stage by stage in dvc.yaml's order (the node has no DVC; commands are read
     from dvc.yaml), on the profile's params (configs/profiles/<name>.yaml merged into one file),
     with `nvidia-smi` sampled every second beside it (gpu_util.csv). After prepare_model, the
     engine bench runs (bench/engine_throughput.py at batch 64 and 512 against generate()).
     Training iteration 1 runs under torch.profiler; the train stage gets a deadline so that it
     stops cleanly, checkpointed, with room left for the final evaluation and the report.
  3. profile      profile.md from that iteration's trace: per phase GPU busy vs idle, the 20
                  costliest kernels, launches and host syncs per micro-batch and per decode
                  step, memory peaks; the trace itself, gzipped and cut to fit
  4. memory       (--memory, if time is left) bench/gpu_memory.py at Qwen2.5-3B's architecture
                  cut to 8 and 16 layers
  5. summary.md and results.json (every figure with the command that produced it), packed with
     the rest into OUT/<date>-<profile>.tgz

Resumable: rerun with the same --out and finished parts are skipped; a train stage stopped at the
budget resumes from its checkpoint (and the stages after it run again). Exit code: 0 finished,
1 a part failed (summary.md names it), 3 stopped at the budget (rerun to continue).

    python bench/gpu_campaign.py --profile gpu1 --out /root/data/campaign [--budget-min 25]
        [--memory] [--detach] [--tiny [--tiny-dir DIR]]
    python bench/gpu_campaign.py --keep OUT/2026-11-24-gpu1.tgz   # evidence -> docs/measurements/

--tiny: the same parts on the CPU with the tiny random model and toy sizes (the test suite runs
it); its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import signal
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import yaml  # noqa: E402

from campaign import archive, environment, profile_report, results, summary, trace  # noqa: E402
from campaign.imports import missing_modules, stage_scripts  # noqa: E402
from campaign.gpu_sampler import GPUSampler  # noqa: E402
from campaign.stages import (BUDGET_SPENT, FINISHED, STALL_S, STALLED, Stage,  # noqa: E402
                             learning_stages, log_tail, run_stage)
from longturn.params.profiles import resolve_profile  # noqa: E402
from longturn.params.config import parse_params  # noqa: E402

PROFILES = ROOT / "configs" / "profiles"
# The profiles sized for one GPU within the lease budget (their headers give the sizing); the
# others in the folder (default, gpu, tools, vision) are not campaign runs.
CAMPAIGN_PROFILES = ("gpu1", "lease15", "babyai5", "grpo", "gigpo", "calculator",
                     "calculator_window_gpu", "babaisai")
# Parts a short lease can leave out (--skip): the learning run is the one thing it must not.
SKIPPABLE = ("engine_throughput", "profile")
PROFILED_ITERATION = 1  # the second: the first pays for allocations and CUDA-graph captures
FINISH_RESERVE_S = 30   # analysis, summary and archive after the last part
STOP_MARGIN_S = 60      # the train stage's own checkpoint and export once its deadline hits
TRACE_MAX_BYTES = 10 * 2**20
EXIT_FAILED, EXIT_BUDGET = 1, 3


class BudgetSpent(Exception):
    """No time left to start the next part."""


def tiny_params(data: dict[str, Any], model_dir: str) -> dict[str, Any]:
    """The profile at toy size on the CPU: same keys, tasks, estimator, protocol and context."""
    d = copy.deepcopy(data)
    d["model"] = {"source": model_dir, "dtype": "float32"}
    d["engine"].update(device="cpu", batch_size=4)
    d["engine"]["sampling"]["max_new_tokens"] = 6
    d["env"].update(max_turns=3, workers=False, step_timeout_s=None)
    d["eval"].update(episodes_per_task=2, parallel_envs=2)
    d["validation"].update(samples_per_task=2, min_valid_action_ratio=0.0)
    group = d["algo"]["group_size"] if d["algo"]["advantage"] != "gae" else 1
    d["rollout"].update(n_envs=max(2, group), turns_per_env=3)
    d["ppo"].update(mini_batch_size=6, micro_batch_size=3, bf16=False)
    d["warmup"].update(batches=1, iterations=1)
    d["train"].update(iterations=2, checkpoint_every=1, launcher="python")
    return d


class Campaign:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out).resolve()
        self.work, self.results_dir = self.out / "work", self.out / "results"
        self.state_path = self.out / "campaign.json"
        self.started = time.time()
        self.deadline = self.started + args.budget_min * 60
        self.state = self._load_state()
        self.results: dict[str, Any] = {}
        self.upstream_ran = False
        self.sampler = GPUSampler(self.results_dir / "gpu_util.csv")
        self.stall_s = STALL_S  # a stage silent this long is taken for hung

    # ---- state ---------------------------------------------------------------------------

    def _load_state(self) -> dict[str, Any]:
        if self.state_path.is_file():
            state = json.loads(self.state_path.read_text())
            if (state["profile"], state["tiny"]) != (self.args.profile, self.args.tiny):
                sys.exit(f"{self.out} holds a campaign of profile {state['profile']!r}"
                         f"{' (tiny)' if state['tiny'] else ''}: use another --out")
            return state
        return {"profile": self.args.profile, "tiny": self.args.tiny, "parts": {},
                "date": date.today().isoformat(), "invocations": 0}

    def _save(self) -> None:
        self.state_path.write_text(json.dumps(self.state, indent=1) + "\n")

    @property
    def name(self) -> str:
        return f"{self.state['date']}-{self.args.profile}" + ("-tiny" if self.args.tiny else "")

    def remaining(self) -> float:
        return self.deadline - time.time() - FINISH_RESERVE_S

    def part(self, name: str, command: str, fn: Callable[[], str], rerun: bool = False) -> None:
        """Run one part unless done (or `rerun`); its status is what `fn` returns."""
        done = self.state["parts"].get(name, {}).get("status") == "done"
        if done and not rerun:
            print(f"[campaign] {name}: done in an earlier run, skipped", flush=True)
            return
        if self.remaining() < 10:
            raise BudgetSpent(name)
        print(f"[campaign] {name}: {command}", flush=True)
        start = time.time()
        record = {"status": "running", "command": command, "started": start}
        self.state["parts"][name] = record
        self._save()
        try:
            record["status"] = fn()
        except BudgetSpent:
            record["status"] = "stopped at the budget"
            raise
        finally:
            if record["status"] == "running":
                record["status"] = "failed"
            record.update(ended=time.time(), seconds=time.time() - start)
            self._save()
        print(f"[campaign] {name}: {record['status']} ({record['seconds']:.0f} s)", flush=True)

    # ---- parts ---------------------------------------------------------------------------

    def environment(self) -> str:
        env = environment.describe()
        line = environment.one_line(env)
        (self.results_dir / "environment.txt").write_text(line + "\n")
        (self.results_dir / "environment.json").write_text(json.dumps(env, indent=1) + "\n")
        print(f"[campaign] {line}", flush=True)
        return "done"

    def imports(self, stages: list[Stage]) -> str:
        """Fail in seconds, naming them, when this node lacks modules a stage imports."""
        missing = missing_modules(stage_scripts(stages))
        (self.results_dir / "missing_modules.json").write_text(json.dumps(missing, indent=1)
                                                              + "\n")
        if not missing:
            return "done"
        named = "; ".join(f"{m} ({', '.join(Path(s).stem for s in used)})"
                          for m, used in missing.items())
        return f"failed (this node lacks: {named}; carry their wheels and rerun)"

    def write_params(self) -> Path:
        data = resolve_profile(PROFILES / f"{self.args.profile}.yaml")
        if self.args.tiny:
            data = tiny_params(data, self.tiny_model())
        parse_params(data, f"profile {self.args.profile}")
        path = self.work / "params.yaml"
        text = (f"# profile {self.args.profile}{' (tiny)' if self.args.tiny else ''}, merged by "
                "bench/gpu_campaign.py\n" + yaml.safe_dump(data, sort_keys=False))
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
        (self.results_dir / "params.yaml").write_text(text)
        return path

    def tiny_model(self) -> str:
        from tiny_model import ensure_tiny_model

        return ensure_tiny_model(Path(self.args.tiny_dir or self.out / "tiny_model"))

    def stage(self, stage: Stage, extra: list[str] | None = None) -> str:
        log = self.results_dir / "logs" / f"{stage.name}.log"
        code, _ = run_stage(stage, log, extra, timeout_s=max(self.remaining(), 1.0),
                            stall_s=self.stall_s)
        self.upstream_ran = True
        if code == BUDGET_SPENT:
            raise BudgetSpent(stage.name)
        if code == STALLED and FINISHED.search(log.read_text(errors="replace")):
            print(f"[campaign] {stage.name} finished its work but did not exit: stopped after "
                  f"{self.stall_s:.0f} s of silence; going on", flush=True)
        elif code == STALLED:
            print(log_tail(log), flush=True)
            return (f"failed (hung: no output for {self.stall_s:.0f} s, killed; "
                    f"logs/{stage.name}.log)")
        elif code != 0:
            print(log_tail(log), flush=True)
            return f"failed (exit {code}; logs/{stage.name}.log)"
        if stage.name == "train" and (self.work / "data/train/final/PARTIAL.json").is_file():
            return "partial"
        return "done"

    def engine_bench(self) -> list[str]:
        argv = [sys.executable, str(ROOT / "bench/engine_throughput.py"), "--params",
                str(ROOT / "params.yaml"), "--json",
                str(self.results_dir / "engine_throughput.json")]
        if self.args.tiny:
            argv += ["--tiny", "--tiny-dir", self.tiny_model()]
        else:
            argv += ["--batches", "64,512", "--model-dir", str(self.work / "data/models/base")]
        return argv

    def run_engine_bench(self, argv: list[str]) -> str:
        code, _ = run_stage(Stage("engine_throughput", argv),
                            self.results_dir / "logs" / "engine_throughput.log",
                            timeout_s=max(self.remaining(), 1.0), stall_s=None)
        return "done" if code == 0 else f"failed (exit {code}; logs/engine_throughput.log)"

    def train_extra(self) -> list[str]:
        eval_s = self.state["parts"].get("zero_shot_eval", {}).get("seconds", 120.0)
        at = self.deadline - FINISH_RESERVE_S - STOP_MARGIN_S - 1.2 * eval_s - 30
        extra = ["--deadline", f"{at:.0f}"]
        if "profile" not in self.args.skip:
            extra += ["--profile-iteration", str(PROFILED_ITERATION),
                      "--profile-out", str(self.work / "profile")]
        return extra

    def profile(self) -> str:
        """The trace analysis in a child process under the budget: reading the trace of a real
        iteration (150 MB gzipped on an H200) takes minutes, and the campaign must still end with
        its summary and archive (2026-11-29)."""
        if not (self.work / "profile" / "trace.json.gz").is_file():
            return "skipped (no trace: the profiled iteration did not run)"
        argv = [sys.executable, str(Path(__file__).resolve()), "--profile", self.args.profile,
                "--out", str(self.out), "--analyse-trace"] + (["--tiny"] if self.args.tiny else [])
        code, _ = run_stage(Stage("profile", argv), self.results_dir / "logs" / "profile.log",
                            timeout_s=max(self.remaining(), 1.0), stall_s=None)
        if code == BUDGET_SPENT:
            raise BudgetSpent("profile")
        return "done" if code == 0 else f"failed (exit {code}; logs/profile.log)"

    def analyse_trace(self) -> None:
        """profile.md, profile.json and the trace cut to fit, from the profiled iteration."""
        source = self.work / "profile" / "trace.json.gz"
        command = self.state["parts"]["train"]["command"]
        analysis = trace.analyse(source, self.work / "profile" / "phases.json")
        note = profile_report.keep_trace(source, self.results_dir / "trace.json.gz",
                                         TRACE_MAX_BYTES)
        (self.results_dir / "profile.md").write_text(
            profile_report.render(analysis, command, note))
        (self.results_dir / "profile.json").write_text(json.dumps(analysis, indent=1) + "\n")

    def memory(self) -> str:
        outputs = []
        for layers in ((None,) if self.args.tiny else (8, 16)):
            argv = [sys.executable, str(ROOT / "bench/gpu_memory.py"), "--params",
                    str(ROOT / "configs/profiles/gpu.yaml")]
            argv += (["--tiny", "--tiny-dir", self.tiny_model()] if self.args.tiny else
                     ["--arch", "qwen2.5-3b", "--layers", str(layers)])
            log = self.results_dir / "logs" / f"gpu_memory_{layers or 'tiny'}.log"
            code, _ = run_stage(Stage("gpu_memory", argv), log,
                                timeout_s=max(self.remaining(), 1.0), stall_s=None)
            if code != 0:
                return f"failed (exit {code}; logs/{log.name})"
            outputs.append(log.read_text())
        (self.results_dir / "gpu_memory.md").write_text(
            "# bench/gpu_memory.py\n\n" + "\n".join(f"```\n{o}```\n" for o in outputs))
        return "done"

    # ---- the whole run -------------------------------------------------------------------

    def run(self) -> int:
        self.results_dir.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        self.state["invocations"] += 1
        self.state.update(command=shlex.join([Path(sys.argv[0]).name] + sys.argv[1:]),
                          budget_s=self.args.budget_min * 60, status="running")
        self._save()
        status = "finished"
        try:
            self.learning_run()
        except BudgetSpent as spent:
            name = spent.args[0]
            during = self.state["parts"].get(name, {}).get("status") == "stopped at the budget"
            status = (f"stopped at the budget {'during' if during else 'before'} {name}: rerun "
                      "with the same --out")
        except Exception as err:  # noqa: BLE001 - the summary and archive are written anyway
            status = f"failed: {type(err).__name__}: {err}"
            raise
        finally:
            self.sampler.stop()
            if any(p["status"].startswith("failed") for p in self.state["parts"].values()):
                status = status if status.startswith("failed") else "failed (see Parts)"
            elif any(p["status"] == "partial" for p in self.state["parts"].values()):
                status = "stopped at the budget during train: rerun with the same --out"
            self.finish(status)
        if status.startswith("failed"):
            return EXIT_FAILED
        return EXIT_BUDGET if status.startswith("stopped") else 0

    def learning_run(self) -> None:
        self.part("environment", "python bench/gpu_campaign.py (environment)", self.environment)
        params = self.write_params()
        launcher = parse_params(yaml.safe_load(params.read_text())).train.launcher
        stages = learning_stages(self.work, params, launcher)
        self.part("imports", "python bench/gpu_campaign.py (imports)",
                  lambda: self.imports(stages))
        if self.state["parts"]["imports"]["status"] != "done":
            return
        self.sampler.start()
        for stage in stages:
            extra = self.train_extra() if stage.name == "train" else []
            command = shlex.join(stage.argv + extra)
            train_partial = (stage.name == "train"
                             and self.state["parts"].get("train", {}).get("status") == "partial")
            self.part(stage.name, command, lambda s=stage, e=extra: self.stage(s, e),
                      rerun=self.upstream_ran or train_partial)
            if self.state["parts"][stage.name]["status"] not in ("done", "partial"):
                return
            if stage.name == "prepare_model" and "engine_throughput" not in self.args.skip:
                bench = self.engine_bench()
                self.part("engine_throughput", shlex.join(bench),
                          lambda b=bench: self.run_engine_bench(b))
        self.sampler.stop()
        train_command = self.state["parts"]["train"]["command"]
        if "profile" not in self.args.skip:
            self.part("profile", train_command, self.profile, rerun=self.upstream_ran)
        if self.args.memory:
            self.part("memory", "python bench/gpu_memory.py --arch qwen2.5-3b --layers 8|16",
                      self.memory)

    def finish(self, status: str) -> None:
        self.state["status"] = status
        self._save()
        self.results = self.gather()
        (self.results_dir / "results.json").write_text(json.dumps(
            {"profile": self.args.profile, "tiny": self.args.tiny, "status": status,
             "parts": self.state["parts"], **self.results}, indent=1, default=str) + "\n")
        (self.results_dir / "summary.md").write_text(summary.render(self.state, self.results))
        bundle = self.out / f"{self.name}.tgz"
        left_out = archive.pack(self.results_dir, bundle)
        note = f" (left out to fit 16 MB: {', '.join(left_out)})" if left_out else ""
        print(f"[campaign] {status}; summary: {self.results_dir / 'summary.md'}; archive: "
              f"{bundle} ({bundle.stat().st_size / 2**20:.1f} MiB){note}", flush=True)

    def gather(self) -> dict[str, Any]:
        commands = {k: p.get("command", "") for k, p in self.state["parts"].items()}
        out: dict[str, Any] = {}
        env_file = self.results_dir / "environment.json"
        if env_file.is_file():
            line = (self.results_dir / "environment.txt").read_text().strip()
            out["environment"] = results.figure({"line": line, **json.loads(env_file.read_text())},
                                                commands.get("environment", ""))
        engine = self.results_dir / "engine_throughput.json"
        if engine.is_file():
            out["engine_throughput"] = results.figure(json.loads(engine.read_text()),
                                                      commands.get("engine_throughput", ""))
        out["evaluation"] = results.paired_evaluation(self.work, commands)
        params = self.work / "params.yaml"  # absent when the budget stopped every part
        protocol = (yaml.safe_load(params.read_text())["rollout"]["protocol"]
                    if params.is_file() else None)
        out["tool_use"] = results.tool_use(self.work, commands, protocol)
        out["training"] = results.training(self.work, commands)
        out["gpu_utilization"] = results.gpu_per_stage(self.results_dir / "gpu_util.csv",
                                                       self.state["parts"])
        profile = self.results_dir / "profile.json"
        if profile.is_file():
            out["profile"] = results.figure(json.loads(profile.read_text()),
                                            commands.get("profile", ""))
        out["goals"] = results.goals(out)
        self.copy_learning_outputs()
        return {k: v for k, v in out.items() if v}

    def copy_learning_outputs(self) -> None:
        """report.md, its PNGs and the metrics JSON of each stage, under results/learning/."""
        dest = self.results_dir / "learning"
        sources = {"report": self.work / "data/report",
                   "zero_shot": self.work / "data/eval/zero_shot",
                   "final": self.work / "data/eval/final", "train": self.work / "data/train/live",
                   "warmup": self.work / "data/critic", "validation": self.work / "data/validation"}
        for label, folder in sources.items():
            for path in (sorted(folder.glob("*.md")) + sorted(folder.glob("*.png"))
                         + sorted(folder.glob("metrics.json"))) if folder.is_dir() else []:
                (dest / label).mkdir(parents=True, exist_ok=True)
                (dest / label / path.name).write_bytes(path.read_bytes())


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", choices=CAMPAIGN_PROFILES, default="gpu1",
                    help="configs/profiles/<name>.yaml (default gpu1)")
    ap.add_argument("--out", default=str(ROOT / "data" / "campaign"),
                    help="results, work dir and state; rerun with the same --out to resume")
    ap.add_argument("--budget-min", type=float, default=25.0,
                    help="wall-clock budget of this invocation in minutes (default 25)")
    ap.add_argument("--skip", action="append", default=[], choices=SKIPPABLE,
                    help="leave this part out (repeatable): a lease shorter than the profile's "
                         "budget spends its minutes on the learning run")
    ap.add_argument("--memory", action="store_true",
                    help="also bench/gpu_memory.py at Qwen2.5-3B cut to 8 and 16 layers")
    ap.add_argument("--keep", default=None, metavar="ARCHIVE",
                    help="copy an archive's evidence to --dest/<date>-<profile>/ and exit")
    ap.add_argument("--dest", default=str(ROOT / "docs" / "measurements"))
    ap.add_argument("--detach", action="store_true",
                    help="run in a new session that outlives this shell; log to OUT/campaign.log")
    ap.add_argument("--tiny", action="store_true", help="CPU, tiny random model, toy sizes")
    ap.add_argument("--analyse-trace", action="store_true",
                    help="(the profile part's child) analyse the trace under --out and exit")
    ap.add_argument("--tiny-dir", default=None, help="with --tiny: reuse the tiny model here")
    args = ap.parse_args()
    if args.budget_min <= 1:
        ap.error("--budget-min must be more than 1 minute")
    return args


def detach(out: Path) -> int:
    """The same command without --detach, in its own session (a closed shell or a finished
    remote call does not end it), its output in OUT/campaign.log."""
    import subprocess

    out.mkdir(parents=True, exist_ok=True)
    log = out / "campaign.log"
    argv = [sys.executable, str(Path(__file__).resolve())] + [a for a in sys.argv[1:]
                                                               if a != "--detach"]
    with log.open("a") as handle:
        proc = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=ROOT)
    print(f"campaign running detached (pid {proc.pid}); log: {log}")
    return 0


def main() -> int:
    args = parse_args()
    if args.keep:
        print(f"evidence kept in {archive.keep(Path(args.keep), Path(args.dest))}")
        return 0
    if args.detach:
        return detach(Path(args.out))
    if args.analyse_trace:
        Campaign(args).analyse_trace()
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(EXIT_BUDGET))  # finish() still runs
    return Campaign(args).run()


if __name__ == "__main__":
    sys.exit(main())
