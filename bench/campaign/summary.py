"""summary.md: the campaign's figures for a reader, each table naming the command behind it."""

from __future__ import annotations

from typing import Any

from longturn.report.training import SuccessBlock, success_reading


def _p(value: float) -> str:
    return f"{value:.2g}" if value >= 1e-3 else f"{value:.1e}"


def _environment(results: dict[str, Any]) -> list[str]:
    env = results.get("environment")
    return [f"**Environment:** {env['value']['line']}", ""] if env else []


def _parts(state: dict[str, Any]) -> list[str]:
    lines = ["## Parts", "", "| part | status | seconds | GPU util % (mean) | command |",
             "|---|---|---|---|---|"]
    util = state.get("gpu_utilization", {})
    for name, part in state["parts"].items():
        u = util.get(name, {}).get("value", {}).get("utilization_mean")
        lines.append(f"| {name} | {part['status']} | {part.get('seconds', 0):.0f} | "
                     f"{'-' if u is None else f'{u:.0f}'} | `{part.get('command', '')}` |")
    return lines + [""]


def _evaluation(results: dict[str, Any]) -> list[str]:
    paired = results.get("evaluation", {})
    if not paired:
        return []
    command = next(iter(paired.values()))["command"]
    lines = ["## Learning: zero-shot vs final on the same seeds", "", f"Commands: `{command}`", "",
             "The run's own report, with its curves: [learning/report/report.md]"
             "(learning/report/report.md).", "",
             "| task | zero-shot | final | lost / gained | exact McNemar p |",
             "|---|---|---|---|---|"]
    for task, f in paired.items():
        v = f["value"]
        (k0, n0), (k1, n1) = v["zero_shot"], v["final"]
        lines.append(f"| {task} | {k0}/{n0} = {k0 / max(n0, 1):.2f} | {k1}/{n1} = "
                     f"{k1 / max(n1, 1):.2f} | {v['lost']} / {v['gained']} | "
                     f"{_p(v['mcnemar_p'])} |")
    return lines + [""]


def _tools(results: dict[str, Any]) -> list[str]:
    tools = results.get("tool_use")
    if not tools:
        return []
    v = tools["value"]
    lines = ["## Tool use (chat protocol)", "", "| | zero-shot | final |", "|---|---|---|"]
    for key, label in (("with_tool_call", "episodes with a tool call"),
                       ("calls_per_episode", "tool calls per episode"),
                       ("valid_call_share", "valid calls"), ("accuracy", "accuracy")):
        a, b = v["zero_shot"][key], v["final"][key]
        show = (lambda x: "-" if x is None else (f"{x:.2f}" if isinstance(x, float) else str(x)))
        lines.append(f"| {label} | {show(a)} | {show(b)} |")
    u = v["used_tool_paired"]
    return lines + ["", f"'Used the tool', paired on seeds: lost {u['lost']}, gained "
                        f"{u['gained']}, exact McNemar p = {_p(u['mcnemar_p'])}.", ""]


def _training(results: dict[str, Any]) -> list[str]:
    t = results.get("training")
    if not t:
        return []
    v = t["value"]
    phases = ", ".join(f"{k} {s:.2f}" for k, s in v["phase_seconds_median"].items() if s)
    stop = v["stopped_early"]
    lines = ["## Training", "", f"Command: `{t['command']}`", "",
             f"- iterations: {v['iterations']}"
             + (f" (stopped at the budget after {stop['iterations_done']} of "
                f"{stop['iterations']}; a rerun resumes)" if stop else ""),
             f"- seconds per iteration (median): {v['seconds_per_iteration_median']:.2f}; "
             f"phases (median s): {phases}",
             f"- training turns/s (median): {v['turns_per_s_median']:.1f}"]
    if v.get("peak_gpu_memory_gib_max") is not None:
        lines.append(f"- peak GPU memory (torch, any phase): "
                     f"{v['peak_gpu_memory_gib_max']:.2f} GiB")
    blocks = [SuccessBlock(**b) for b in v.get("success_halves", [])]
    lines += success_reading(blocks, label="training success")
    return lines + [""]


def _engine(results: dict[str, Any]) -> list[str]:
    e = results.get("engine_throughput")
    if not e:
        return []
    lines = ["## Engine vs generate()", "", f"Command: `{e['command']}`", "",
             "| batch | engine tok/s | generic loop tok/s | generate() tok/s "
             "| engine / generate() |",
             "|---|---|---|---|---|"]
    for size, b in e["value"]["batches"].items():
        rates = list(b["tokens_per_s"].values())
        lines.append(f"| {size} | {rates[0]:.0f} | {rates[1]:.0f} | {rates[2]:.0f} | "
                     f"{b['engine_vs_generate']:.2f}x |")
    return lines + [""]


def _goals(results: dict[str, Any]) -> list[str]:
    g = results.get("goals")
    if not g:
        return []
    lines = ["## Goals (one GPU)", "", "| goal | target | measured | met |", "|---|---|---|---|"]
    labels = {"train_turns_per_s": "training turns/s", "train_gpu_utilization":
              "GPU utilisation during train, %", "engine_vs_generate_at_512":
              "engine / generate() at batch 512"}
    for key, v in g.items():
        measured = "-" if v["measured"] is None else f"{v['measured']:.1f}"
        met = "-" if v["met"] is None else ("yes" if v["met"] else "no")
        lines.append(f"| {labels[key]} | {v['goal']:.1f} | {measured} | {met} |")
    return lines + [""]


def render(state: dict[str, Any], results: dict[str, Any]) -> str:
    head = [f"# GPU campaign: profile `{state['profile']}`"
            + (" (tiny mode: CPU, tiny random model, toy sizes; the numbers mean nothing)"
               if state.get("tiny") else ""), "",
            f"Command: `{state['command']}`; budget {state['budget_s'] / 60:.0f} min; "
            f"status: **{state['status']}**.", ""]
    profile_note = (["## Profile", "", "Where one training iteration's time goes: "
                     "[profile.md](profile.md).", ""] if state["parts"].get("profile", {})
                    .get("status") == "done" else [])
    return "\n".join(head + _environment(results) + _evaluation(results) + _tools(results)
                     + _training(results) + _engine(results) + _goals(results) + profile_note
                     + _parts({**state, "gpu_utilization": results.get("gpu_utilization", {})}))
