"""The action protocol's prompt validation plays each seed's first reply as training's first
lock-step does and keeps it as the sample training writes, as the chat protocol keeps its
episodes: the audit reads `data/validation/` like any run, and every number of the report is
read back from those samples (checked here against the replies' own text, parsed again
independently, and the prompts against the env's own first observations)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from longturn.engines.base import Completion, SamplingParams
from longturn.agent.prompts import build_prompt
from longturn.envs.registry import make_env
from longturn.errors import UserError
from longturn.params.config import load_params
from longturn.run.validation import render_report, validate_env_task
from longturn.trajectories import SAMPLE_SCHEMA, read_metadata, write_samples

ROOT = Path(__file__).resolve().parents[1]

# (reply, finish reason, the failure the report must name: None for a clean reply)
REPLIES = [
    ("THINK: the ball is ahead.\nACTION: go forward", "stop", None),
    ("THINK: left it is.\nACTION: left", "stop", None),  # a synonym: valid after translation
    ("I would rather not say.", "stop", "no_action"),
    ("THINK: up.\nACTION: fly upwards", "stop", "unknown_action"),
    ("ACTION: turn left\nACTION: turn right", "stop", "multiple_actions"),
    ("THINK: I will think about this for a long", "length", "cut_by_length"),
]


class ScriptedEngine:
    """Answers prompt i with REPLIES[i]."""

    def __init__(self, tokenizer) -> None:
        self.ids = [tokenizer(text, add_special_tokens=False)["input_ids"]
                    for text, _, _ in REPLIES]

    def generate(self, prompts, sampling):
        return [Completion(list(self.ids[i]), [-0.5] * len(self.ids[i]), REPLIES[i][1])
                for i in range(len(prompts))]


@pytest.fixture(scope="module")
def validated(smollm2_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    params = load_params(ROOT / "params.yaml")
    assert params.env.name == "babyai"
    seeds = list(range(7, 7 + len(REPLIES)))
    result = validate_env_task(ScriptedEngine(tokenizer), tokenizer, params, "goto",
                               SamplingParams(1.0, 1.0, 0, 32, seed=0), seeds)
    return result, tokenizer, seeds, params


def test_each_first_reply_is_a_sample_of_its_seeds_first_observation(validated) -> None:
    result, tokenizer, seeds, params = validated
    assert [s["episode_seed"] for s in result.samples] == seeds
    assert len({s["episode_id"] for s in result.samples}) == len(seeds)
    for seed, sample, (text, finish, _) in zip(seeds, result.samples, REPLIES):
        env = make_env("babyai", "goto")
        try:  # the prompt of the seed's first observation, rendered here on an env of its own
            first, _ = env.reset(seed=seed)
            expected = build_prompt(tokenizer, env.instructions, [], first.text,
                                    params.prompt.max_prompt_tokens, params.prompt.demonstration)
        finally:
            env.close()
        assert sample["prompt_ids"] == expected.ids
        assert sample["prompt_text"] == expected.text
        (reply,) = sample["replies"]
        assert (reply["start"], reply["end"]) == (0, len(sample["response_ids"]))
        assert sample["loss_mask"] == [1] * len(sample["response_ids"])
        assert tokenizer.decode(sample["response_ids"]) == reply["response_text"] == text
        assert reply["finish_reason"] == finish and reply["turn"] == reply["step"] == 0
        assert reply["observation"] == first.text


def test_the_metrics_are_what_the_replies_say(validated) -> None:
    result, _, _, _ = validated
    m = result.metrics
    n = len(REPLIES)
    assert m["samples"] == n
    assert m["valid_action_ratio"] == pytest.approx(3 / n)  # forward, left, the last of two tags
    assert m["valid_before_translation_ratio"] == pytest.approx(2 / n)  # "left" is a synonym
    for kind in ("no_action", "unknown_action", "multiple_actions", "cut_by_length"):
        assert m[f"failure_{kind}"] == pytest.approx(1 / n), kind
    assert m["failure_empty"] == 0
    assert m["think_present_ratio"] == pytest.approx(4 / n)


def test_the_report_names_each_failure(validated) -> None:
    result, _, seeds, _ = validated
    report = render_report([result], [], 0.0, {}, examples_per_task=len(REPLIES))
    for seed, (_, _, failure) in zip(seeds, REPLIES):
        status = "valid" if failure in (None, "multiple_actions") else f"invalid ({failure})"
        assert f"Seed {seed}: {status}, executed `" in report


def test_the_audit_reads_a_validation_dir(validated, tmp_path) -> None:
    result, _, seeds, _ = validated
    out = tmp_path / "validation"
    write_samples(result.samples, out / "samples.parquet", {"sampling": {}})
    assert set(SAMPLE_SCHEMA.names) <= set(pq.read_schema(out / "samples.parquet").names)
    assert read_metadata(out / "samples.parquet")["schema_version"] == "2"
    audit = [sys.executable, "-m", "longturn.cli", "audit"]
    summary = subprocess.run([*audit, "summary", "--json", str(out)], capture_output=True,
                             text=True, check=True)
    overall = json.loads(summary.stdout)["overall"]
    assert overall["turns"] == overall["episodes"] == len(seeds)
    assert overall["valid_action_ratio"] == pytest.approx(result.metrics["valid_action_ratio"])
    show = subprocess.run([*audit, "show", result.samples[2]["episode_id"], str(out)],
                          capture_output=True, text=True, check=True)
    assert "I would rather not say." in show.stdout


def test_an_env_that_cannot_start_stops_validation_naming_task_and_seed(validated) -> None:
    _, tokenizer, _, params = validated
    env = params.env.model_copy(update={"name": "flaky_envs:FlakyCorridor", "tasks": ["corridor"],
                                        "kwargs": {"raise_on_reset": [8]}})
    broken = params.model_copy(update={"env": env})
    with pytest.raises(UserError, match="task 'corridor' seed 8: the episode could not start"):
        validate_env_task(ScriptedEngine(tokenizer), tokenizer, broken, "corridor",
                          SamplingParams(1.0, 1.0, 0, 32, seed=0), [7, 8])
