"""`longturn audit show` lists every reply of an episode, wherever its replies sit: an env slot's
turns, a packed whole episode, a windowed conversation (a sample per reply, the conversation on the
last one; with fixed turns, spread over iterations) and an agent's calls (a sample per call, the
conversation its last call sent). Each reply gets its own reward/value/advantage/return line,
and `show` agrees with `episodes` and `summary` on every layout. `plot` and `diff` read an
episode spread over several samples whole too. The agent episodes are played by the example
ReAct agent against a scripted engine; the other files are built by hand, scored with the rule
training uses and written with write_samples."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

import test_audit
import test_audit_conversation
from test_audit_conversation import audit, audit_json
from endpoint_engines import ScriptedEngine
from longturn.algo.gae import GAEParams
from longturn.algo.reply_chains import ADVANTAGE_INPUTS, sample_advantages
from longturn.engines.base import SamplingParams
from longturn.params.config import parse_params
from longturn.rollout.conversation_setup import ConversationRun
from longturn.rollout.samples import samples_from_episodes
from longturn.trajectories import write_samples

GAE = {"gamma_step": 0.9, "lambda_step": 0.95, "gamma_token": 1.0, "lambda_token": 1.0}
ALGO = {"advantage": "gae", "group_size": 1, "norm_std": True, "step_weight": 1.0}
CALL = '<tool_call>{"name":"calculator","arguments":{"expression":"6*7"}}</tool_call>'
SYSTEM = "Add the numbers. Use the calculator."


def score_and_write(samples: list[dict[str, Any]], part: Path, iteration: int,
                    rng: np.random.Generator) -> None:
    """Values, token rewards (each reply's reward on its last token), advantages and returns as
    scoring fills them, written as training writes them."""
    for s in samples:
        n = len(s["response_ids"])
        s["values"] = rng.normal(size=n).astype(np.float32).tolist()
        rewards = np.zeros(n, dtype=np.float32)
        rewards[-1] = s["replies"][0]["reward"]
        s["token_rewards"] = rewards.tolist()
        s["old_logprobs"] = s["ref_logprobs"] = list(s["engine_logprobs"])
    columns = {k: [s[k] for s in samples] for k in ADVANTAGE_INPUTS}
    advantages, returns = sample_advantages(columns, GAEParams(**GAE), None)
    for s, a, r in zip(samples, advantages, returns):
        s["advantages"] = a.astype(np.float32).tolist()
        s["returns"] = r.astype(np.float32).tolist()
    write_samples(samples, part, {**GAE, "algo": ALGO, "model": "none", "engine": "hf",
                                  "iteration": iteration})


# ------------------------------------------------------------------ agent calls

@pytest.fixture(scope="module")
def agent_run(smollm2_tokenizer_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two episodes of the example ReAct agent, two calls each: a calculator call, then the
    answer once the tool result is in the prompt."""
    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    tool_turn = tokenizer.encode("<|im_start|>tool", add_special_tokens=False)

    def reply(prompt: list[int]) -> str:
        if any(prompt[i:i + len(tool_turn)] == tool_turn for i in range(len(prompt))):
            return "ANSWER: 42"
        return f"I compute.\n{CALL}"

    params = parse_params({"env": {"tasks": ["arithmetic_plain"]}, "rollout": {
        "protocol": "chat", "agent": "examples.react_calculator_agent:agent"}})
    run = ConversationRun.from_params(params, progress=False)
    tasks = [run.record("arithmetic_plain", seed) for seed in (1, 2)]
    sampling = SamplingParams(max_new_tokens=48, temperature=1.0, top_p=1.0, top_k=0, seed=3)
    records = run.play(ScriptedEngine(tokenizer, reply), tokenizer, sampling, tasks,
                       ["agent-0", "agent-1"])
    for record in records:
        record.update(run_id="t", policy_version="p0", iteration=0)
    root = tmp_path_factory.mktemp("agent") / "run"
    samples = samples_from_episodes(records)
    assert [len(s["replies"]) for s in samples] == [1, 1, 1, 1]  # a sample per call
    score_and_write(samples, root / "trajectories/iteration=0000/part-00.parquet", 0,
                    np.random.default_rng(0))
    return root


def stored_replies(root: Path, episode_id: str) -> list[dict[str, Any]]:
    """The episode's replies as written, each with its sample's per-token lists cut to it."""
    out = []
    for part in sorted(root.glob("trajectories/iteration=*/part-*.parquet")):
        for s in pq.read_table(part).to_pylist():
            if s["episode_id"] == episode_id:
                out += [{**r, **{k: s[k][r["start"]] for k in ("values", "advantages", "returns")}}
                        for r in s["replies"]]
    return sorted(out, key=lambda r: r["turn"])


def test_show_lists_every_call_of_an_agent_episode(agent_run, capsys):
    stored = stored_replies(agent_run, "agent-0")
    assert len(stored) == 2
    data = audit_json(capsys, "show", "agent-0", str(agent_run))
    assert data["samples"] == 2 and data["not_in_conversation"] == []
    assert [r["reply"] for r in data["replies"]] == [0, 1]
    for shown, reply in zip(data["replies"], stored):
        assert shown["reward"] == pytest.approx(reply["reward"])
        for key, column in (("value", "values"), ("advantage", "advantages"),
                            ("return", "returns")):
            assert shown[key] == pytest.approx(reply[column])
    assert data["reward"] == pytest.approx(sum(r["reward"] for r in stored))
    # each call's reply is its own assistant message: the tool call, then the answer
    assistant = [m for m in data["messages"] if m["role"] == "assistant"]
    assert [m["reply"] for m in assistant] == [0, 1]
    assert assistant[0]["content"] == 'I compute.\n→ calculator({"expression": "6*7"})'
    assert assistant[1]["content"] == "ANSWER: 42"

    code, text, _ = audit(capsys, "show", "agent-0", str(agent_run))
    assert code == 0 and "· 2 replies in 2 samples (one per reply)" in text
    for reply in stored:
        assert (f"reward after it {reply['reward']:.4f} · V {reply['values']:.4f} · advantage "
                f"{reply['advantages']:.4f} · return {reply['returns']:.4f}") in text
    assert "── assistant · reply 0 · " in text and "── assistant · reply 1 · " in text
    assert "· iteration 0 · step 0 · its prompt" in text

    one = audit_json(capsys, "show", "agent-0", str(agent_run), "--turn", "0", "--no-prompt")
    assert [r["reply"] for r in one["replies"]] == [0]
    assert [m["role"] for m in one["messages"]] == ["assistant", "tool"]


def test_a_call_the_last_conversation_left_out_still_shows(agent_run, capsys, tmp_path):
    """An agent that drops history: its last call's conversation holds only its last reply; the
    first call's reply is shown on its own, with its numbers, not matched to another message."""
    copy = tmp_path / "run"
    shutil.copytree(agent_run, copy)
    part = copy / "trajectories/iteration=0000/part-00.parquet"

    def drop_history(texts: list[str | None]) -> list[str | None]:
        out = []
        for text in texts:
            messages = None if text is None else json.loads(text)
            out.append(None if messages is None else
                       json.dumps([m for m in messages if m["role"] in ("system", "user")]
                                  + messages[-1:]))
        return out

    table = pq.read_table(part)
    at = table.schema.get_field_index("messages")
    new = pa.array(drop_history(table.column("messages").to_pylist()), type=pa.string())
    pq.write_table(table.set_column(at, table.schema.field("messages"), new), part)
    data = audit_json(capsys, "show", "agent-0", str(copy))
    assert [r["reply"] for r in data["replies"]] == [0, 1]
    assert data["not_in_conversation"] == [0]
    assert [m["reply"] for m in data["messages"] if m["role"] == "assistant"] == [1]
    code, text, _ = audit(capsys, "show", "agent-0", str(copy))
    assert code == 0 and "(its text is not in the stored conversation)" in text
    assert "1 reply(ies) not in the stored conversation" in text
    assert text.count("reward after it") == 2


def test_plot_and_diff_read_every_call(agent_run, capsys, tmp_path):
    turns = audit_json(capsys, "summary", str(agent_run))["overall"]["turns"]
    plotted = audit_json(capsys, "plot", str(agent_run), "--out", str(tmp_path / "plots"))
    assert plotted["replies"] == turns == 4
    # the tool result the second call was given differs: named by that call's reply
    copy = tmp_path / "copy"
    shutil.copytree(agent_run, copy)
    part = copy / "trajectories/iteration=0000/part-00.parquet"
    table = pq.read_table(part)
    prompts = table.column("prompt_ids").to_pylist()
    first_call = len(prompts[0])
    prompts[1][first_call + 5] += 1  # after what the first call was given
    at = table.schema.get_field_index("prompt_ids")
    pq.write_table(table.set_column(at, table.schema.field("prompt_ids"),
                                    pa.array(prompts, type=table.schema.field("prompt_ids").type)),
                   part)
    code, out, _ = audit(capsys, "diff", str(agent_run), str(copy), "--json")
    first = json.loads(out)["first_difference"]
    assert code == 1
    assert (first["row"], first["column"], first["episode_id"], first["turn"],
            first["token"]) == (1, "prompt_ids", "agent-0", 1, first_call + 5)


# ------------------------------------------------------------------ windowed conversations

def window_record(name: str, turns: range, *, messages: bool, cut: bool,
                  rng: np.random.Generator) -> dict[str, Any]:
    """A windowed conversation's record (or one fixed-turn part of it) for the replies `turns`:
    each reply's window as its prompt, its sampled ids, one lock-step each; reward 1 on the
    episode's last reply. The conversation (every reply an assistant message after a few-shot
    example) only where `messages`, as on an episode's last part."""
    ids, starts, ends = [], [], []
    for k in turns:
        starts.append(len(ids))
        ids += [200 + 10 * k + j for j in range(3 + k % 2)]
        ends.append(len(ids))
    conversation = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "1+1?"},
                    {"role": "assistant", "content": "EXAMPLE 2"}, {"role": "user",
                                                                    "content": "2+2?"}]
    for k in range(turns.stop):
        conversation += [{"role": "assistant", "content": f"reply {k}: <tool_call>{k}"},
                         {"role": "tool", "name": "calculator", "content": f"RESULT-{k}"}]
    return {
        "run_id": "t", "policy_version": "p0", "task": "arith", "episode_id": name,
        "episode_seed": 5, "group_id": None, "input_ids": ids, "loss_mask": [1] * len(ids),
        "engine_logprobs": (-rng.random(len(ids))).tolist(), "segment_starts": starts,
        "segment_ends": ends,
        "segment_rewards": [0.0] * (len(turns) - 1) + [0.0 if cut else 1.0],
        "reward": 0.0 if cut else 1.0, "success": not cut, "truncated": False,
        "termination": None if cut else "done", "first_turn": turns.start, "cut": cut,
        "reply_steps": list(range(len(turns))),
        "window_prompts": [[1, 2, 3, 100 + k] for k in turns],
        "window_frames": [[] for _ in turns], "window_image_starts": [[] for _ in turns],
        "images": [], "bootstrap_value": 0.25 if cut else None,
        **({"bootstrap_prompt_ids": [1, 2, 3, 100 + turns.stop], "bootstrap_frames": [],
            "bootstrap_image_starts": []} if cut else {}),
        "messages": json.dumps(conversation) if messages else None, "metrics": "{}",
        "tool_calls": turns.stop if messages else None, "tool_errors": 0 if messages else None,
        "user_turns": 1, "assistant_turns": turns.stop, "tokenization_check": "identical",
    }


@pytest.fixture(scope="module")
def window_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Iteration 0: `win-0` whole (3 replies) and the first two replies of `win-1`, cut by the
    fixed-turn batch; iteration 1: `win-1`'s last reply, with the episode's conversation."""
    rng = np.random.default_rng(4)
    root = tmp_path_factory.mktemp("window") / "run"
    parts = {0: [window_record("win-0", range(0, 3), messages=True, cut=False, rng=rng),
                 window_record("win-1", range(0, 2), messages=False, cut=True, rng=rng)],
             1: [window_record("win-1", range(2, 3), messages=True, cut=False, rng=rng)]}
    for iteration, records in parts.items():
        for slot, record in enumerate(records):
            record.update(iteration=iteration, env_index=slot if iteration == 0 else 1)
        score_and_write(samples_from_episodes(records),
                        root / f"trajectories/iteration={iteration:04d}/part-00.parquet",
                        iteration, rng)
    return root


def test_show_lists_every_windowed_reply(window_run, capsys):
    data = audit_json(capsys, "show", "win-0", str(window_run))
    stored = stored_replies(window_run, "win-0")
    assert [r["reply"] for r in data["replies"]] == [0, 1, 2] == [r["turn"] for r in stored]
    assert [r["advantage"] for r in data["replies"]] == pytest.approx(
        [r["advantages"] for r in stored])
    # the few-shot example is not a reply: the replies are the last assistant messages
    assistant = [m for m in data["messages"] if m["role"] == "assistant"]
    assert [m["reply"] for m in assistant] == [None, 0, 1, 2]
    assert data["tokenization_check"] == "identical" and data["tool_calls"] == 3
    code, text, _ = audit(capsys, "show", "win-0", str(window_run))
    assert code == 0 and text.count("reward after it") == 3 and "3 replies in 3 samples" in text


def test_a_windowed_episode_over_two_iterations(window_run, capsys):
    data = audit_json(capsys, "show", "win-1", str(window_run))
    assert [(r["reply"], r["iteration"], r["step"]) for r in data["replies"]] == [
        (0, 0, 0), (1, 0, 1), (2, 1, 0)]
    assert data["iterations"] == [0, 1] and data["not_in_conversation"] == []
    assert data["termination"] == "done" and data["success"] is True
    code, text, _ = audit(capsys, "show", "win-1", str(window_run))
    assert code == 0 and "iterations 0..1" in text and text.count("reward after it") == 3
    # iteration 0 alone: the episode goes on, its conversation not stored yet
    first = audit_json(capsys, "show", "win-1", str(window_run / "trajectories/iteration=0000"))
    assert [r["reply"] for r in first["replies"]] == [0, 1]
    assert first["not_in_conversation"] == [0, 1] and first["messages"] == []
    assert first["bootstrap_value"] == pytest.approx(0.25)
    code, text, _ = audit(capsys, "show", "win-1",
                          str(window_run / "trajectories/iteration=0000"))
    assert code == 0 and "none is stored yet (the episode goes on past these files)" in text
    assert text.count("(its text is not in the stored conversation)") == 2


# ------------------------------------------------------------------ every layout agrees

@pytest.fixture(scope="module")
def env_slot_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("env_slots") / "run"
    test_audit.write_run(root)
    return root


@pytest.fixture(scope="module")
def packed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("packed") / "run"
    test_audit_conversation.write_run(root, test_audit_conversation.ALGO)
    return root


@pytest.mark.parametrize("layout", ["env_slot_run", "packed_run", "window_run", "agent_run"])
def test_show_agrees_with_episodes_and_summary(layout, request, capsys):
    root = str(request.getfixturevalue(layout))
    episodes = audit_json(capsys, "episodes", root)
    summary = audit_json(capsys, "summary", root)["overall"]
    assert sum(e["length"] for e in episodes) == summary["turns"]
    for episode in episodes:
        data = audit_json(capsys, "show", episode["episode_id"], root)
        shown = data["replies"] if "replies" in data else data["turns"]
        assert len(shown) == episode["length"], episode["episode_id"]
        assert sum(r["reward"] for r in shown) == pytest.approx(episode["return"])
        assert all(r["value"] is not None and r["advantage"] is not None for r in shown)
        code, text, _ = audit(capsys, "show", episode["episode_id"], root)
        lines = "reward after it" if "replies" in data else "V(s) "
        assert code == 0 and text.count(lines) == episode["length"]
