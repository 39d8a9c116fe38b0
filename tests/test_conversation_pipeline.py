"""Profile `tools` (the chat protocol) through the real `dvc exp run` of all seven stages, at toy
size on the tiny model: validation reports tool-call validity, evaluations count endings per
reason, training writes audited packed samples whose loss mask is exactly the replies."""

from __future__ import annotations

import json

import pandas as pd
from transformers import AutoTokenizer

from longturn.algo.sample_scoring import audit_samples_file
from longturn.params.profiles import resolve_profile
from longturn.trajectories import read_metadata
from test_pipeline_smoke import ROOT, STAGES, _dvc, _git, scratch_repo


def toy_sequence_params(model_dir: str, profile: str = "tools") -> dict:
    """A shipped profile of the chat protocol at toy size on `model_dir`."""
    params = resolve_profile(ROOT / "configs" / "profiles" / f"{profile}.yaml")
    params["model"] = {"source": model_dir, "dtype": "float32"}
    params["engine"].update(batch_size=4)
    params["engine"]["sampling"].update(max_new_tokens=10)
    params["eval"].update(episodes_per_task=2, parallel_envs=2)
    params["validation"].update(samples_per_task=2, min_valid_action_ratio=0.0)
    params["rollout"].update(n_envs=2)
    params["rollout"]["chat"].update(max_tokens=500)
    params["ppo"].update(mini_batch_size=2, micro_batch_size=1, bf16=False)
    params["warmup"].update(iterations=1)
    params["train"].update(iterations=1)
    return params


def one_reply_sequence_params(model_dir: str) -> dict:
    """The tools profile at toy size cut to one short reply per episode (an evaluation of it is
    a few generate calls), its plugin files by absolute path (for a stage run in process)."""
    params = toy_sequence_params(model_dir)
    params["engine"]["sampling"].update(max_new_tokens=4)
    chat = params["rollout"]["chat"]
    chat.update(max_assistant_turns=1, max_user_turns=0)
    for key in ("tools", "interactions"):
        if chat.get(key):
            chat[key] = str(ROOT / chat[key])
    return params


def test_dvc_exp_run_of_the_tools_profile(tmp_path, tiny_model_dir):
    repo = scratch_repo(tmp_path, toy_sequence_params(tiny_model_dir))
    out = _dvc(repo, "exp", "run", "-n", "tools")
    for stage in STAGES:
        assert f"Running stage '{stage}'" in out
    validation = json.loads((repo / "data/validation/metrics.json").read_text())
    task = validation["tasks"]["arithmetic"]
    assert {"tool_call_validity", "valid_action_ratio", "tool_calls_per_episode"} <= set(task)
    assert validation["passed"] and (repo / "data/validation/passed").is_file()
    for side in ("zero_shot", "final"):
        metrics = json.loads((repo / f"data/eval/{side}/metrics.json").read_text())
        overall = metrics["overall"]
        assert overall["episodes"] == 2 and set(metrics["tasks"]) == {"arithmetic"}
        assert sum(v for k, v in overall.items() if k.startswith("termination/")) == 2
        assert 0 <= overall["success_ci95_low"] <= overall["success_ci95_high"] <= 1
        turns = repo / f"data/eval/{side}/turns.parquet"
        assert read_metadata(turns)["schema_version"] == "2"
        # one packed sample per episode: no env slot, the conversation kept, nothing scored
        samples = pd.read_parquet(turns)
        assert len(samples) == 2 and samples["env_index"].isna().all()
        assert samples["messages"].notna().all() and samples["advantages"].isna().all()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    part = repo / "data/train/trajectories/iteration=0000/part-00.parquet"
    assert audit_samples_file(part) < 1e-4
    for row in pd.read_parquet(part).itertuples():
        masked = [t for t, m in zip(row.response_ids, row.loss_mask) if m]
        closing = tokenizer.convert_tokens_to_ids("<|im_end|>")
        assistant = [m["content"] for m in json.loads(row.messages) if m["role"] == "assistant"]
        replies = assistant[len(assistant) - row.assistant_turns:]  # after the worked example
        # the masked tokens are the replies as sampled: decoded, reply by reply, they are the
        # assistant messages (plus the end-of-turn token each sampled)
        spans = [list(row.response_ids[r["start"]:r["end"]]) for r in row.replies]
        assert masked == [t for span in spans for t in span]
        assert [tokenizer.decode([t for t in span if t != closing]) for span in spans] == replies
    report = (repo / "data/report/report.md").read_text()
    assert "arithmetic" in report
