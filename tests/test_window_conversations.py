"""The two combinations a history window opens, through the real `dvc exp run` of all seven stages
at toy size: arithmetic with the calculator tool (profile calculator_window) on the tiny model,
and BabyAI goto with frames (profile vision_window) on a tiny random LLaVA. Training collects
Verlog's fixed-turn batches (episodes carried over, a cut one bootstrapped) and writes one
sample per reply whose prompt is that reply's window: the task and the last N turns, nothing
older (for BabyAI an env slot's prompt: past observations as text, the current one's frame
alone); the advantages are finite and `longturn audit gae` recomputes them from the files. And
bench/turn_cost.py --conversation, the cost of a late reply against an early one in both
contexts, runs in its tiny mode."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from transformers import AutoTokenizer

from longturn.algo.sample_scoring import audit_samples_file
from test_pipeline_smoke import STAGES, _dvc, _git, scratch_repo
from test_conversation_pipeline import toy_sequence_params
from vlm_fixtures import TOKENS_PER_IMAGE, build_tiny_llava

ROOT = Path(__file__).resolve().parents[1]
TURNS = 1  # prompt.history_turns: reply k sees reply k-1, never k-2
LONGER_REVISIONS = """interactions:
  - name: revise
    class: longturn.tasks.arithmetic:RevisionInteraction
    config:
      max_revisions: 3
"""


def audit_gae(repo: Path) -> None:
    """`longturn audit gae` over the run's training files, as a user runs it."""
    cli = Path(sys.executable).parent / "longturn"
    done = subprocess.run([str(cli), "audit", "gae", str(repo / "data/train")], cwd=repo,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def episodes(part: Path) -> list[list]:
    """The training file's samples, episode by episode, in reply order. Fixed-turn batches
    (a critic): each slot gives every lock-step one reply; an episode's replies are consecutive
    lock-steps of its slot, and one still running at the batch's end is a bootstrapped segment
    end."""
    samples = pd.read_parquet(part)
    slots = samples["env_index"].tolist()
    steps = [r[0]["step"] for r in samples["replies"]]
    turns_per_env = max(steps) + 1
    assert sorted(zip(slots, steps)) == [(slot, step) for slot in sorted(set(slots))
                                         for step in range(turns_per_env)]
    out = []
    for _, group in samples.groupby("episode_id"):
        rows = sorted(group.itertuples(), key=lambda r: r.replies[0]["turn"])
        assert all(len(r.replies) == 1 for r in rows)  # one reply per sample
        assert [r.replies[0]["turn"] for r in rows] == list(range(len(rows)))
        first = rows[0].replies[0]["step"]
        assert [r.replies[0]["step"] for r in rows] == list(range(first, first + len(rows)))
        assert len({r.env_index for r in rows}) == 1 and rows[0].env_index is not None
        end = rows[-1].replies[0]
        if end["termination"] is None:  # cut at the batch's end: the critic sees its next window
            assert end["segment_end"] and end["step"] == turns_per_env - 1
            assert len(rows[-1].bootstrap_prompt_ids) > 0
        for r in rows:
            assert list(r.loss_mask) == [1] * len(r.response_ids)
            assert np.isfinite(r.advantages).all() and np.isfinite(r.returns).all()
        out.append(rows)
    return out


def test_arithmetic_with_the_calculator_trained_with_a_window(tmp_path, tiny_model_dir):
    params = toy_sequence_params(tiny_model_dir, "calculator_window")
    params["prompt"]["history_turns"] = TURNS
    # up to three revisions: a random model's episodes run four replies, past the window
    params["rollout"]["chat"].update(interactions="configs/longer_revisions.yaml",
                                         max_user_turns=3, max_tokens=600)
    repo = scratch_repo(tmp_path, params)
    (repo / "configs/longer_revisions.yaml").write_text(LONGER_REVISIONS)
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "interactions")
    out = _dvc(repo, "exp", "run", "-n", "calculator_window")
    for stage in STAGES:
        assert f"Running stage '{stage}'" in out
    for side in ("zero_shot", "final"):
        metrics = json.loads((repo / f"data/eval/{side}/metrics.json").read_text())
        assert metrics["overall"]["episodes"] == 2  # counted once, however many samples
        turns = pd.read_parquet(repo / f"data/eval/{side}/turns.parquet")
        assert turns["env_index"].notna().all() and (turns["replies"].map(len) == 1).all()
    part = repo / "data/train/trajectories/iteration=0000/part-00.parquet"
    assert audit_samples_file(part) < 1e-4
    audit_gae(repo)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    checked = 0
    for rows in episodes(part):
        last = rows[-1]
        if last.messages is None:  # still running when the batch ended: no messages yet
            continue
        assistant = [m["content"] for m in json.loads(last.messages) if m["role"] == "assistant"]
        replies = assistant[len(assistant) - int(last.assistant_turns):]  # after the worked example
        task = tokenizer.decode(rows[0].prompt_ids)  # the first reply sees the task alone
        for k, row in enumerate(rows):
            prompt = tokenizer.decode(row.prompt_ids)
            assert prompt.startswith(task[:task.rindex("<|im_start|>assistant")])
            if k >= 1:
                assert replies[k - 1] in prompt
            old = k - TURNS - 1
            if old >= 0 and len(replies[old].strip()) >= 8 and replies[old] not in task:
                assert replies[old] not in prompt, (k, replies[old])
                checked += 1
    assert checked, "no episode ran past its window: nothing was checked"


def test_babyai_frames_trained_with_a_window(tmp_path, smollm2_tokenizer_dir):
    llava = build_tiny_llava(smollm2_tokenizer_dir, tmp_path / "llava")
    params = toy_sequence_params(str(llava), "vision_window")
    params["prompt"]["history_turns"] = TURNS
    params["rollout"]["chat"].update(max_assistant_turns=3, max_user_turns=3, max_tokens=1200)
    repo = scratch_repo(tmp_path, params)
    out = _dvc(repo, "exp", "run", "-n", "vision_window")
    for stage in STAGES:
        assert f"Running stage '{stage}'" in out
    part = repo / "data/train/trajectories/iteration=0000/part-00.parquet"
    assert audit_samples_file(part) < 1e-4
    audit_gae(repo)
    tokenizer = AutoTokenizer.from_pretrained(llava)
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    longest = 0
    for rows in episodes(part):
        longest = max(longest, len(rows))
        for k, row in enumerate(rows):
            # an env slot's prompt: the last TURNS steps as text, the current observation's
            # frame alone, at its placeholders
            text = tokenizer.decode(row.prompt_ids)
            assert text.count("<|im_start|>user\nObservation:\n") == min(k, TURNS)
            assert len(row.images) == len(row.image_starts) == 1
            (start,) = row.image_starts
            assert list(row.prompt_ids[start:start + TOKENS_PER_IMAGE]) == \
                [image_id] * TOKENS_PER_IMAGE
        if rows[-1].replies[0]["truncated"]:  # cut short: the critic sees the next observation
            assert len(rows[-1].bootstrap_images) == len(rows[-1].bootstrap_image_starts) == 1
    assert longest > TURNS + 1, "no episode ran past its window"


def test_turn_cost_compares_a_late_reply_with_an_early_one_in_both_contexts():
    done = subprocess.run([sys.executable, str(ROOT / "bench/turn_cost.py"), "--conversation",
                           "--tiny"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ratios = re.search(r"ratio reply 12 / reply 3: whole episode time [\d.]+x prompt ([\d.]+)x"
                       r"   window time [\d.]+x prompt ([\d.]+)x", done.stdout)
    assert ratios, done.stdout
    whole, window = map(float, ratios.groups())
    assert whole > 1.5 and window == 1.0  # the window's prompt does not grow with the episode
    assert re.search(r"ratio whole episode / window at reply 12: time [\d.]+x", done.stdout)
    assert re.search(r"reply 12's window \(\d+ tok\) tokenized: .* ratio whole text / piece "
                     r"cache [\d.]+x", done.stdout)
