"""`longturn audit` on packed whole episodes (one sample holding all of an episode's replies),
built by hand without a model: episodes of two replies around a tool call, laid out as the
whole-episode rollout records them, converted with sample_from_episode, scored with the rule
training uses (sample_advantages) and written with write_samples and the metadata training
writes. Every subcommand reads them, episodes, plot and diff included."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longturn.algo.gae import GAEParams
from longturn.algo.group_advantages import GroupParams
from longturn.algo.reply_chains import ADVANTAGE_INPUTS, sample_advantages
from longturn.audit.cli import main
from longturn.rollout.samples import sample_from_episode
from longturn.trajectories import write_samples
from longturn.vision.frames import to_png

GAE = {"gamma_step": 0.9, "lambda_step": 0.95, "gamma_token": 1.0, "lambda_token": 1.0}
ALGO = {"advantage": "gae", "group_size": 2, "norm_std": True, "step_weight": 1.0}
SYSTEM = "You are a careful assistant. " * 5 + "Use the calculator."
PROMPT = 6  # tokens before the first reply


def episode(rng: np.random.Generator, n: int, *, task: str, success: bool,
            reward_after: list[float], termination: str = "done", tool_errors: int = 0,
            critic: bool = True, group_id: str | None = None) -> dict[str, Any]:
    """An episode record: prompt (6 tokens) · reply 0 · close · tool result · reply 1 · close,
    every per-token list as long as its whole sequence, as the whole-episode rollout lays it."""
    ids, mask, starts, ends = list(range(100, 100 + PROMPT)), [0] * PROMPT, [], []
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


def score(samples: list[dict[str, Any]], algo: dict[str, Any]) -> None:
    """Advantages and returns as scoring fills them (one rule: algo/reply_chains.py)."""
    columns = {k: [s[k] for s in samples] for k in ADVANTAGE_INPUTS}
    if algo["advantage"] == "gae":
        gae, group = GAEParams(**GAE), None
    else:
        gae, group = None, GroupParams.from_algo(algo, GAE["gamma_step"])
    advantages, returns = sample_advantages(columns, gae, group)
    for sample, a, r in zip(samples, advantages, returns):
        sample["advantages"] = a.astype(np.float32).tolist()
        sample["returns"] = r.astype(np.float32).tolist()


def write_run(root: Path, algo: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    """Iteration 0: three episodes (one cut short by the reply limit, one with a failed tool
    call); iteration 1: one. Returns the samples by iteration."""
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
    samples_by_iteration = {}
    for iteration, records in by_iteration.items():
        for r in records:
            r["iteration"] = iteration
        samples = [sample_from_episode(r) for r in records]
        score(samples, algo)
        metadata = {**GAE, "algo": algo, "model": "none", "engine": "hf",
                    "iteration": iteration}
        write_samples(samples, root / f"trajectories/iteration={iteration:04d}/part-00.parquet",
                      metadata)
        samples_by_iteration[iteration] = samples
    return samples_by_iteration


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, list[dict[str, Any]]]]:
    root = tmp_path_factory.mktemp("packed") / "run"
    return root, write_run(root, ALGO)


def audit(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def audit_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    code, out, err = audit(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def _rewrite(part: Path, column: str, change) -> None:
    """Rewrite one column of a file in place, keeping its metadata (version, discounts, algo)."""
    table = pq.read_table(part)
    values = change(table.column(column).to_pylist())
    field = table.schema.field(column)
    pq.write_table(table.set_column(table.schema.get_field_index(column), field,
                                    pa.array(values, type=field.type)), part)


def test_the_file_holds_one_packed_sample_per_episode(run):
    root, _ = run
    part = root / "trajectories/iteration=0000/part-00.parquet"
    meta = pq.read_schema(part).metadata
    assert meta[b"longturn.schema_version"] == b"2" and b"longturn.mode" not in meta
    table = pq.read_table(part)
    assert table.num_rows == 3
    assert [len(r) for r in table.column("replies").to_pylist()] == [2, 2, 2]
    assert table.column("env_index").null_count == 3  # packed: no env slot


def test_gae_recomputes_packed_files_and_catches_a_tampered_one(run, capsys, tmp_path):
    root, samples = run
    data = audit_json(capsys, "gae", str(root))
    assert data["ok"] and len(data["files"]) == 2
    assert [f["iteration"] for f in data["files"]] == [0, 1]
    assert data["worst"]["max_abs_error"] < 1e-5
    code, text, _ = audit(capsys, "gae", str(root))
    assert code == 0 and "— OK at tolerance" in text

    tampered = tmp_path / "tampered"
    shutil.copytree(root, tampered)
    part = tampered / "trajectories/iteration=0000/part-00.parquet"
    start = samples[0][1]["replies"][1]["start"]

    def shift(advantages):
        advantages[1][start] += 0.5
        return advantages

    _rewrite(part, "advantages", shift)
    code, text, _ = audit(capsys, "gae", str(tampered))
    assert code == 1 and "MISMATCH" in text and "iteration=0000" in text
    data = json.loads(audit(capsys, "gae", str(tampered), "--json")[1])
    assert data["worst"]["max_abs_error"] == pytest.approx(0.5, abs=1e-5)
    assert data["worst"]["iteration"] == 0


def test_gae_on_critic_free_packed_files(tmp_path, capsys):
    algo = {**ALGO, "advantage": "grpo"}
    samples = write_run(tmp_path / "grpo", algo)
    assert samples[0][0]["values"] is None
    advantages = [a for s in samples[0] for a in s["advantages"]]
    assert max(map(abs, advantages)) > 0.1  # the group's rewards differ: something to check
    data = audit_json(capsys, "gae", str(tmp_path / "grpo"))
    assert data["ok"] and data["worst"]["max_abs_error"] < 1e-5


def test_gae_on_an_unscored_packed_file_is_one_line(tmp_path, capsys):
    record = episode(np.random.default_rng(0), 1, task="arith", success=True,
                     reward_after=[0.0, 1.0])
    for key in ("values", "token_rewards", "advantages", "returns", "bootstrap_value"):
        record[key] = None
    write_samples([sample_from_episode(record)], tmp_path / "eval/turns.parquet",
                  {"policy_version": "p0"})
    code, _, err = audit(capsys, "gae", str(tmp_path / "eval"))
    assert code == 2 and err.count("\n") == 1 and "gamma_step" in err


def test_show_renders_the_conversation_reply_by_reply(run, capsys):
    root, samples = run
    sample = samples[0][1]  # ep-2: cut short, bootstrapped
    data = audit_json(capsys, "show", "ep-2", str(root))
    assert (data["task"], data["episode_seed"], data["iteration"]) == ("arith", 42, 0)
    assert data["termination"] == "max_assistant_turns" and data["truncated"] is True
    assert data["bootstrap_value"] == pytest.approx(0.3)
    assert data["reward"] == pytest.approx(0.1)
    assert (data["prompt_tokens"], data["sampled_tokens"]) == (PROMPT, 7)
    assert [m["role"] for m in data["messages"]] == ["system", "user", "assistant", "tool",
                                                     "assistant"]
    assert [m["reply"] for m in data["messages"]] == [None, None, 0, None, 1]
    assert data["messages"][3]["name"] == "calculator"
    replies = data["replies"]
    assert [r["tokens"] for r in replies] == [3, 4]
    assert [r["reward"] for r in replies] == pytest.approx([0.1, 0.0])
    for reply, stored in zip(replies, sample["replies"]):
        start = stored["start"]
        assert reply["start"] == start and reply["end"] == stored["end"]
        assert reply["value"] == pytest.approx(sample["values"][start])
        assert reply["advantage"] == pytest.approx(sample["advantages"][start])
        assert reply["return"] == pytest.approx(sample["returns"][start])
    assert replies[1]["start"] == 3 + 1 + 3  # reply 0, its closing, the tool result
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
    assert (f"reward after it 0.1000 · V {sample['values'][0]:.4f} · advantage "
            f"{sample['advantages'][0]:.4f} · return {sample['returns'][0]:.4f}") in text


def test_show_without_prompt_and_one_reply(run, capsys):
    root, samples = run
    code, text, _ = audit(capsys, "show", "ep-1", str(root), "--no-prompt")
    assert code == 0 and SYSTEM not in text and "What is 1 + 2?" not in text
    assert "reply 0" in text and "RESULT-3" in text
    data = audit_json(capsys, "show", "ep-1", str(root), "--turn", "1")
    assert [r["reply"] for r in data["replies"]] == [1]
    assert [m["role"] for m in data["messages"]] == ["tool", "assistant"]  # since reply 0
    sample = samples[0][0]
    assert data["replies"][0]["advantage"] == pytest.approx(
        sample["advantages"][sample["replies"][1]["start"]])
    code, _, err = audit(capsys, "show", "ep-1", str(root), "--turn", "5")
    assert code == 2 and "no reply 5" in err
    code, _, err = audit(capsys, "show", "no-such-episode", str(root))
    assert code == 2 and err.count("\n") == 1 and "no-such-episode" in err


def test_show_writes_the_frames_as_stored(tmp_path, capsys):
    record = episode(np.random.default_rng(1), 1, task="arith", success=True,
                     reward_after=[0.0, 1.0])
    frames = [to_png(np.full((4, 4, 3), k * 60, dtype=np.uint8)) for k in range(2)]
    record.update(images=frames, image_starts=[1, 3])
    write_samples([sample_from_episode(record)], tmp_path / "eval/turns.parquet", {})
    data = audit_json(capsys, "show", "ep-1", str(tmp_path / "eval"), "--frames",
                      str(tmp_path / "frames"))
    assert data["images"] == 2
    assert [Path(p).read_bytes() for p in data["frames"]] == frames
    assert [Path(p).name for p in data["frames"]] == ["ep-1-0.png", "ep-1-1.png"]


def test_summary_counts_replies_episodes_and_tool_calls(run, capsys):
    root, _ = run
    data = audit_json(capsys, "summary", str(root))
    assert data["iterations"] == [0, 1] and data["tasks"] == ["arith", "lookup"]
    overall = data["overall"]
    assert (overall["turns"], overall["samples"], overall["episodes"]) == (8, 4, 4)
    assert (overall["ended"], overall["successes"]) == (4, 2)
    assert overall["success_rate"] == pytest.approx(0.5)
    assert overall["mean_reward"] == pytest.approx((1.1 + 0.1 - 0.2 + 1.0) / 8)
    assert overall["valid_action_ratio"] is None  # tool calls, no parsed env actions
    assert (overall["tool_calls"], overall["tool_calls_per_episode"]) == (4, pytest.approx(1.0))
    assert overall["tool_call_validity"] == pytest.approx(0.75)
    assert (overall["done"], overall["max_assistant_turns"], overall["continues"]) == (3, 1, 4)
    assert data["tokenization_check"] == {"identical": 4}
    assert [(r["iteration"], r["episodes"]) for r in data["per_iteration"]] == [(0, 3), (1, 1)]
    per_task = {r["task"]: r for r in data["per_task"]}
    assert per_task["lookup"]["tool_call_validity"] == pytest.approx(0.5)
    assert [per_task[t]["max_assistant_turns"] for t in ("lookup", "arith")] == [0, 1]
    assert per_task["arith"]["success_rate"] == pytest.approx(0.5)
    code, text, _ = audit(capsys, "summary", str(root))
    assert code == 0 and "success: 2/4 episodes that ended on their own (0.500)" in text
    assert "turns (replies): 8 in 4 sample(s)" in text
    assert "tool-call validity: 0.750" in text and "valid-action ratio: -" in text
    assert "done 3 · max_assistant_turns 1" in text and "tokenization check: identical 4" in text
    assert "per iteration:" in text and "per task:" in text


def test_episodes_over_packed_samples(run, capsys):
    root, samples = run
    episodes = {e["episode_id"]: e for e in audit_json(capsys, "episodes", str(root))}
    assert sorted(episodes) == ["ep-1", "ep-2", "ep-3", "ep-4"]
    for sample in (s for rows in samples.values() for s in rows):
        listed = episodes[sample["episode_id"]]
        assert listed["length"] == len(sample["replies"]) == 2
        assert listed["return"] == pytest.approx(sum(r["reward"] for r in sample["replies"]))
        assert listed["first_iteration"] == listed["last_iteration"] == sample["iteration"]
    assert (episodes["ep-2"]["ended_by"], episodes["ep-2"]["success"]) == (
        "max_assistant_turns", False)
    assert (episodes["ep-1"]["ended_by"], episodes["ep-1"]["success"]) == ("done", True)
    assert episodes["ep-1"]["valid_action_ratio"] is None and episodes["ep-1"]["env_return"] is None
    won = audit_json(capsys, "episodes", str(root), "--success", "yes")
    assert sorted(e["episode_id"] for e in won) == ["ep-1", "ep-4"]
    later = audit_json(capsys, "episodes", str(root), "--iteration", "1", "--task", "lookup")
    assert [e["episode_id"] for e in later] == ["ep-4"]


def test_plot_over_packed_samples(run, capsys, tmp_path):
    root, _ = run
    data = audit_json(capsys, "plot", str(root), "--out", str(tmp_path / "plots"))
    assert sorted(Path(p).name for p in data["written"]) == ["advantages.png", "returns.png"]
    assert data["skipped"] == ["action_mix.png"]  # tool-call replies execute no env action
    for path in data["written"]:
        assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, text, _ = audit(capsys, "plot", str(root), "--out", str(tmp_path / "plots"))
    assert code == 0 and "skipped action_mix.png: no executed actions" in text


def test_diff_names_a_changed_tool_result_by_the_reply_before_it(run, capsys, tmp_path):
    root, samples = run
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    assert audit_json(capsys, "diff", str(root), str(copy))["identical"]
    part = copy / "trajectories/iteration=0000/part-00.parquet"
    at = samples[0][2]["replies"][0]["end"] + 2  # inside the tool result after reply 0

    def change(ids):
        ids[2][at] += 1
        return ids

    _rewrite(part, "response_ids", change)
    code, out, _ = audit(capsys, "diff", str(root), str(copy), "--json")
    first = json.loads(out)["first_difference"]
    assert code == 1
    assert (first["iteration"], first["row"], first["column"], first["token"], first["episode_id"],
            first["turn"]) == (0, 2, "response_ids", at, "ep-3", 0)
    code, out, _ = audit(capsys, "diff", str(root), str(copy))
    assert f"sample 2 (episode ep-3, turn 0): response_ids differ at token {at}" in out


def test_sql_over_packed_samples(run, capsys):
    root, samples = run
    rows = audit_json(capsys, "sql", "SELECT iteration, rank, count(*) AS n, "
                      "sum(tool_errors) AS e, sum(len(replies)) AS replies FROM samples "
                      "GROUP BY ALL ORDER BY 1", str(root))
    assert rows == [{"iteration": 0, "rank": 0, "n": 3, "e": 1, "replies": 6},
                    {"iteration": 1, "rank": 0, "n": 1, "e": 0, "replies": 2}]
    replies = audit_json(capsys, "sql", "SELECT episode_id, turn, len(response_ids) AS k, "
                         "reward, \"values\"[1] AS v FROM turns ORDER BY episode_id, turn",
                         str(root))
    every = [(s["episode_id"], r) for rows_ in samples.values() for s in rows_
             for r in s["replies"]]
    assert [(r["episode_id"], r["turn"], r["k"]) for r in replies] == [
        (e, r["turn"], r["end"] - r["start"]) for e, r in sorted(every, key=lambda x: x[0])]
    assert [r["v"] for r in replies[:2]] == pytest.approx(
        [samples[0][0]["values"][r["start"]] for r in samples[0][0]["replies"]])
    sampled = audit_json(capsys, "sql", "SELECT sum(len(response_ids)) AS k FROM turns", str(root))
    assert sampled == [{"k": sum(sum(s["loss_mask"]) for rows_ in samples.values()
                                 for s in rows_)}]
    rows = audit_json(capsys, "sql", "SELECT count(*) AS n FROM turns WHERE truncated",
                      str(root / "trajectories/iteration=0000/part-00.parquet"))
    assert rows == [{"n": 1}]
