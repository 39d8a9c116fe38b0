"""`longturn audit` on sequence-mode files (one row per episode), built by hand without a model:
episodes of two replies around a tool call, scored with the same rule as training
(sequence_advantages), written with write_sequences and the metadata training writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longturn.algo.gae import GAEParams
from longturn.algo.group_advantages import GroupParams
from longturn.algo.sequence_scoring import ADVANTAGE_INPUTS, sequence_advantages
from longturn.audit.cli import main
from longturn.trajectories import write_sequences

GAE = {"gamma_step": 0.9, "lambda_step": 0.95, "gamma_token": 1.0, "lambda_token": 1.0}
ALGO = {"advantage": "gae", "group_size": 2, "norm_std": True, "step_weight": 1.0}
SYSTEM = "You are a careful assistant. " * 5 + "Use the calculator."


def episode(rng: np.random.Generator, n: int, *, task: str, success: bool,
            reward_after: list[float], termination: str = "done", tool_errors: int = 0,
            critic: bool = True, group_id: str | None = None) -> dict[str, Any]:
    """prompt (6 tokens) · reply 0 · close · tool result · reply 1 · close, as packing lays it."""
    ids, mask, starts, ends = list(range(100, 106)), [0] * 6, [], []
    lengths = (3 + n % 2, 4)
    for k, length in enumerate(lengths):
        if k:  # the tool result between the replies: context
            ids += [300 + n, 301, 302]
            mask += [0, 0, 0]
        starts.append(len(ids))
        ids += [200 + 10 * k + j for j in range(length)]
        mask += [1] * length
        ends.append(len(ids))
        ids.append(2)  # the template's closing of the reply
        mask.append(0)
    m = np.asarray(mask, dtype=np.float32)
    values = (rng.normal(size=len(ids)).astype(np.float32) * m) if critic else None
    rewards = (rng.normal(scale=0.01, size=len(ids)).astype(np.float32) * m)
    for end, r in zip(ends, reward_after):
        rewards[end - 1] += r
    truncated = termination != "done"
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"What is {n} + 2?"},
                {"role": "assistant", "content": f"<tool_call>calc {n}+2</tool_call>"},
                {"role": "tool", "name": "calculator", "content": f"RESULT-{n + 2}"},
                {"role": "assistant", "content": f"The answer is {n + 2}."}]
    return {
        "run_id": "test", "policy_version": "p0", "task": task, "episode_id": f"ep-{n}",
        "episode_seed": 40 + n, "input_ids": ids, "loss_mask": mask,
        "engine_logprobs": [0.0] * len(ids), "segment_starts": starts, "segment_ends": ends,
        "segment_rewards": reward_after, "reward": float(sum(reward_after)), "success": success,
        "termination": termination, "truncated": truncated, "assistant_turns": 2,
        "user_turns": 0, "tool_calls": 1, "tool_errors": tool_errors,
        "tokenization_check": "identical", "messages": json.dumps(messages),
        "metrics": json.dumps({}), "old_logprobs": [0.0] * len(ids),
        "ref_logprobs": [0.0] * len(ids), "values": None if values is None else values.tolist(),
        "token_rewards": rewards.tolist(),
        "bootstrap_value": 0.3 if truncated and critic else None, "group_id": group_id,
    }


def score(records: list[dict[str, Any]], algo: dict[str, Any]) -> None:
    """Advantages and returns as score_sequences fills them."""
    columns = {k: [r.get(k) for r in records] for k in ADVANTAGE_INPUTS}
    if algo["advantage"] == "gae":
        gae, group = GAEParams(**GAE), None
    else:
        gae, group = None, GroupParams.from_algo(algo, GAE["gamma_step"])
    advantages, returns = sequence_advantages(columns, gae, group)
    for record, a, r in zip(records, advantages, returns):
        record["advantages"] = a.astype(np.float32).tolist()
        record["returns"] = r.astype(np.float32).tolist()


def write_run(root: Path, algo: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    """Iteration 0: three episodes (one cut short by the reply limit, one with a failed tool
    call); iteration 1: one. Returns the records by iteration."""
    rng = np.random.default_rng(7)
    critic = algo["advantage"] == "gae"
    by_iteration = {
        0: [episode(rng, 1, task="arith", success=True, reward_after=[0.1, 1.0], critic=critic,
                    group_id=None if critic else "g0"),
            episode(rng, 2, task="arith", success=False, reward_after=[0.1, 0.0],
                    termination="max_assistant_turns", critic=critic,
                    group_id=None if critic else "g0"),
            episode(rng, 3, task="lookup", success=False, reward_after=[-0.2, 0.0],
                    tool_errors=1, critic=critic, group_id=None if critic else "g1")],
        1: [episode(rng, 4, task="lookup", success=True, reward_after=[0.0, 1.0], critic=critic,
                    group_id=None if critic else "g1")],
    }
    if not critic:  # a group of one is degenerate: give iteration 1 its own pair
        by_iteration[1].append(episode(rng, 5, task="lookup", success=False,
                                       reward_after=[0.0, 0.0], critic=False, group_id="g1"))
    for iteration, records in by_iteration.items():
        for r in records:
            r["iteration"] = iteration
        score(records, algo)
        metadata = {**GAE, "algo": algo, "model": "none", "engine": "hf",
                    "iteration": iteration}
        write_sequences(records, root / f"trajectories/iteration={iteration:04d}/part-00.parquet",
                        metadata)
    return by_iteration


@pytest.fixture()
def run(tmp_path: Path) -> tuple[Path, dict[int, list[dict[str, Any]]]]:
    return tmp_path / "run", write_run(tmp_path / "run", ALGO)


def audit(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def audit_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    code, out, err = audit(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_the_file_is_a_sequence_file(run):
    root, _ = run
    part = root / "trajectories/iteration=0000/part-00.parquet"
    meta = pq.read_schema(part).metadata
    assert meta[b"longturn.mode"] == b"sequence" and pq.read_metadata(part).num_rows == 3


def test_gae_recomputes_sequence_files_and_catches_a_tampered_one(run, capsys):
    root, _ = run
    data = audit_json(capsys, "gae", str(root))
    assert data["ok"] and len(data["files"]) == 2
    assert [f["iteration"] for f in data["files"]] == [0, 1]
    assert data["worst"]["max_abs_error"] < 1e-5
    code, text, _ = audit(capsys, "gae", str(root))
    assert code == 0 and "— OK at tolerance" in text

    part = root / "trajectories/iteration=0000/part-00.parquet"
    table = pq.read_table(part)  # keeps the metadata (mode, discounts, algo)
    advantages = table.column("advantages").to_pylist()
    start = table.column("segment_starts").to_pylist()[1][1]
    advantages[1][start] += 0.5
    column = pa.array(advantages, type=table.schema.field("advantages").type)
    pq.write_table(table.set_column(table.schema.get_field_index("advantages"), "advantages",
                                    column), part)
    code, text, _ = audit(capsys, "gae", str(root))
    assert code == 1 and "MISMATCH" in text and "iteration=0000" in text
    data = json.loads(audit(capsys, "gae", str(root), "--json")[1])
    assert data["worst"]["max_abs_error"] == pytest.approx(0.5, abs=1e-5)
    assert data["worst"]["iteration"] == 0


def test_gae_on_critic_free_sequence_files(tmp_path, capsys):
    algo = {**ALGO, "advantage": "grpo"}
    by_iteration = write_run(tmp_path / "grpo", algo)
    assert by_iteration[0][0]["values"] is None
    advantages = [a for r in by_iteration[0] for a in r["advantages"]]
    assert max(map(abs, advantages)) > 0.1  # the group's rewards differ: something to check
    data = audit_json(capsys, "gae", str(tmp_path / "grpo"))
    assert data["ok"] and data["worst"]["max_abs_error"] < 1e-5


def test_gae_on_an_unscored_sequence_file_is_one_line(tmp_path, capsys):
    record = episode(np.random.default_rng(0), 1, task="arith", success=True,
                     reward_after=[0.0, 1.0])
    for key in ("values", "token_rewards", "advantages", "returns", "bootstrap_value"):
        record[key] = None
    write_sequences([record], tmp_path / "eval/turns.parquet", {"policy_version": "p0"})
    code, _, err = audit(capsys, "gae", str(tmp_path / "eval"))
    assert code == 2 and err.count("\n") == 1 and "gamma_step" in err


def test_show_renders_the_conversation_reply_by_reply(run, capsys):
    root, by_iteration = run
    record = by_iteration[0][1]  # ep-2: cut short, bootstrapped
    data = audit_json(capsys, "show", "ep-2", str(root))
    assert (data["task"], data["episode_seed"], data["iteration"]) == ("arith", 42, 0)
    assert data["termination"] == "max_assistant_turns" and data["truncated"] is True
    assert data["bootstrap_value"] == pytest.approx(0.3)
    assert [m["role"] for m in data["messages"]] == ["system", "user", "assistant", "tool",
                                                     "assistant"]
    assert [m["reply"] for m in data["messages"]] == [None, None, 0, None, 1]
    assert data["messages"][3]["name"] == "calculator"
    replies = data["replies"]
    assert [r["tokens"] for r in replies] == [3, 4]
    assert [r["reward"] for r in replies] == pytest.approx([0.1, 0.0])
    for reply, start in zip(replies, record["segment_starts"]):
        assert reply["start"] == start
        assert reply["value"] == pytest.approx(record["values"][start])
        assert reply["advantage"] == pytest.approx(record["advantages"][start])
        assert reply["return"] == pytest.approx(record["returns"][start])
    assert replies[0]["advantage"] != 0.0

    code, text, _ = audit(capsys, "show", "ep-2", str(root))
    assert code == 0
    assert "episode ep-2 · task arith · seed 42 · iteration 0" in text
    assert "termination max_assistant_turns (truncated)" in text
    assert "tool calls 1 (0 error(s)) · tokenization check identical" in text
    assert "── assistant · reply 0 · 3 tokens" in text
    assert "── assistant · reply 1 · 4 tokens" in text
    assert "── tool (calculator)" in text and "RESULT-4" in text
    assert SYSTEM in text
    first = record["segment_starts"][0]
    assert (f"reward after it 0.1000 · V {record['values'][first]:.4f} · advantage "
            f"{record['advantages'][first]:.4f} · return {record['returns'][first]:.4f}") in text


def test_show_without_prompt_and_one_reply(run, capsys):
    root, by_iteration = run
    code, text, _ = audit(capsys, "show", "ep-1", str(root), "--no-prompt")
    assert code == 0 and SYSTEM not in text and "What is 1 + 2?" not in text
    assert "reply 0" in text and "RESULT-3" in text
    data = audit_json(capsys, "show", "ep-1", str(root), "--turn", "1")
    assert [r["reply"] for r in data["replies"]] == [1]
    assert [m["role"] for m in data["messages"]] == ["tool", "assistant"]  # since reply 0
    record = by_iteration[0][0]
    assert data["replies"][0]["advantage"] == pytest.approx(
        record["advantages"][record["segment_starts"][1]])
    code, _, err = audit(capsys, "show", "ep-1", str(root), "--turn", "5")
    assert code == 2 and "no reply 5" in err
    code, _, err = audit(capsys, "show", "no-such-episode", str(root))
    assert code == 2 and err.count("\n") == 1 and "no-such-episode" in err


def test_summary_counts_episodes(run, capsys):
    root, _ = run
    data = audit_json(capsys, "summary", str(root))
    assert data["mode"] == "sequence" and data["iterations"] == [0, 1]
    assert data["tasks"] == ["arith", "lookup"]
    overall = data["overall"]
    assert (overall["episodes"], overall["successes"]) == (4, 2)
    assert overall["success_rate"] == pytest.approx(0.5)
    assert overall["mean_reward"] == pytest.approx((1.1 + 0.1 - 0.2 + 1.0) / 4)
    assert overall["mean_replies"] == pytest.approx(2.0)
    assert overall["tool_calls_per_episode"] == pytest.approx(1.0)
    assert overall["tool_call_validity"] == pytest.approx(0.75)
    assert (overall["done"], overall["max_assistant_turns"], overall["max_user_turns"],
            overall["token_budget"]) == (3, 1, 0, 0)
    assert data["tokenization_check"]["identical"] == 4
    assert [(r["iteration"], r["episodes"]) for r in data["per_iteration"]] == [(0, 3), (1, 1)]
    per_task = {r["task"]: r for r in data["per_task"]}
    assert per_task["lookup"]["tool_call_validity"] == pytest.approx(0.5)
    assert per_task["arith"]["success_rate"] == pytest.approx(0.5)
    code, text, _ = audit(capsys, "summary", str(root))
    assert code == 0 and "sequence mode" in text and "success: 2/4 (0.500)" in text
    assert "tool-call validity: 0.750" in text
    assert "termination: done 3 · max_assistant_turns 1" in text
    assert "per iteration:" in text and "per task:" in text


@pytest.mark.parametrize("args", [["episodes"], ["plot", "--out", "PLOTS"], ["diff", "RUN"]])
def test_turn_only_commands_refuse_sequence_files(run, capsys, tmp_path, args):
    root, _ = run
    argv = [a.replace("PLOTS", str(tmp_path / "plots")) for a in args]
    argv = [*argv[:1], str(root), *(str(root) if a == "RUN" else a for a in argv[1:])]
    code, out, err = audit(capsys, *argv)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "sequence-mode" in err and f"`{args[0]}` reads turn-mode files" in err
    assert "summary, show, gae, sql" in err
    assert not (tmp_path / "plots").exists()


def test_sql_over_sequence_files(run, capsys):
    root, _ = run
    rows = audit_json(capsys, "sql", "SELECT iteration, rank, count(*) AS n, "
                      "sum(tool_errors) AS e, sum(len(segment_starts)) AS replies FROM turns "
                      "GROUP BY ALL ORDER BY 1",
                      str(root))
    assert rows == [{"iteration": 0, "rank": 0, "n": 3, "e": 1, "replies": 6},
                    {"iteration": 1, "rank": 0, "n": 1, "e": 0, "replies": 2}]
    rows = audit_json(capsys, "sql", "SELECT count(*) AS n FROM turns WHERE truncated",
                      str(root / "trajectories/iteration=0000/part-00.parquet"))
    assert rows == [{"n": 1}]
