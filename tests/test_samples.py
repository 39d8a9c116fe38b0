"""Sample schema v2 (docs/design.md §4): turn rows and sequence records, converted to samples and
written as v2, are read back as the training batch they describe (the loss tokens are the loss
mask less aborted replies, advantages whitened over them); the file keeps every column; a v1 file
and a sample whose replies do not tile its loss tokens are refused."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from longturn.algo.batches import TurnBatch, read_sample_batch
from longturn.errors import TrajectoryFileError
from longturn.rollout.samples import sample_from_episode, samples_from_episodes
from turn_rows import sample_from_turn, samples_from_turns
from longturn.trajectories import (SAMPLE_SCHEMA, V1_SCHEMA_VERSION, file_metadata, rows_table,
                                   write_arrow, write_samples)
from longturn.vision.frames import to_png

PNGS = [to_png(np.full((2, 3, 3), k * 40, dtype=np.uint8)) for k in range(3)]
FLOATS = st.floats(-4, 4, width=32, allow_nan=False)
TOKEN = st.integers(0, 3000)
SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _floats(draw: st.DrawFn, n: int) -> list[float]:
    return draw(st.lists(FLOATS, min_size=n, max_size=n))


@st.composite
def turn_rows(draw: st.DrawFn, critic: bool) -> dict:
    """A scored turn row as a collector and scoring leave it."""
    n = draw(st.integers(1, 6))
    aborted = draw(st.booleans())
    terminated = not aborted and draw(st.booleans())
    row = {
        "run_id": "train", "policy_version": "it3", "iteration": 3,
        "env_index": draw(st.integers(0, 3)), "env_name": "babyai", "task": "goto",
        "episode_id": draw(st.sampled_from(["e0", "e1", "e2"])),
        "episode_seed": draw(st.integers(0, 2**40)), "turn": draw(st.integers(0, 50)),
        "step": draw(st.integers(0, 7)),
        "prompt_ids": draw(st.lists(TOKEN, min_size=1, max_size=8)),
        "response_ids": draw(st.lists(TOKEN, min_size=n, max_size=n)),
        "prompt_text": "obs", "response_text": "THINK: x ACTION: go",
        "raw_action": "go", "action": "go forward", "action_valid": draw(st.booleans()),
        "action_failure": None, "env_reward": draw(FLOATS), "reward": draw(FLOATS),
        "terminated": terminated, "truncated": not terminated and draw(st.booleans()),
        "success": terminated, "segment_end": draw(st.booleans()), "aborted": aborted,
        "termination": "env_error" if aborted else None, "finish_reason": "stop",
        "history_dropped": draw(st.integers(0, 3)), "observation": "you see a door",
        "group_id": None if critic else "g0", "done": aborted or terminated,
        "engine_logprobs": _floats(draw, n), "old_logprobs": _floats(draw, n),
        "ref_logprobs": _floats(draw, n), "values": _floats(draw, n) if critic else None,
        "next_value": draw(FLOATS) if critic else None, "token_rewards": _floats(draw, n),
        "advantages": _floats(draw, n), "returns": _floats(draw, n),
        "logprob_gap": draw(FLOATS),
        "bootstrap_prompt_ids": draw(st.one_of(st.none(), st.lists(TOKEN, min_size=1,
                                                                     max_size=4))),
    }
    return row


@st.composite
def sequence_records(draw: st.DrawFn, critic: bool) -> dict:
    """A scored sequence record: prompt, then replies each followed by context (the template's
    closing, tool results); training columns 0 on context, as scoring leaves them."""
    ids = draw(st.lists(TOKEN, min_size=1, max_size=6))
    mask = [0] * len(ids)
    starts, ends = [], []
    for _ in range(draw(st.integers(0, 4))):
        reply = draw(st.lists(TOKEN, min_size=1, max_size=5))
        context = draw(st.lists(TOKEN, min_size=0, max_size=4))
        starts.append(len(ids))
        ids += reply
        ends.append(len(ids))
        ids += context
        mask += [1] * len(reply) + [0] * len(context)
    if not starts and len(ids) < 2:
        ids.append(draw(TOKEN))
        mask.append(0)

    def per_token() -> list[float]:
        return [v if m else 0.0 for v, m in zip(_floats(draw, len(ids)), mask)]

    truncated = draw(st.booleans())
    n_images = draw(st.integers(0, 2))
    record = {
        "run_id": "train", "policy_version": "it3", "iteration": 3, "task": "math",
        "episode_id": draw(st.sampled_from(["s0", "s1", "s2"])),
        "episode_seed": draw(st.integers(0, 2**40)),
        "input_ids": ids, "loss_mask": mask, "engine_logprobs": per_token(),
        "segment_starts": starts, "segment_ends": ends,
        "segment_rewards": _floats(draw, len(starts)), "reward": 0.5,
        "success": not truncated and draw(st.booleans()),
        "termination": "token_budget" if truncated else "done", "truncated": truncated,
        "assistant_turns": len(starts), "user_turns": draw(st.integers(0, 3)),
        "tool_calls": draw(st.integers(0, 3)), "tool_errors": draw(st.integers(0, 1)),
        "tokenization_check": "identical", "messages": json.dumps([{"role": "user"}]),
        "metrics": json.dumps({"calls": 1.0}),
        "images": [PNGS[k % 3] for k in range(n_images)],
        "image_starts": sorted(draw(st.lists(st.integers(0, len(ids) - 1), min_size=n_images,
                                             max_size=n_images))),
        "old_logprobs": per_token(), "ref_logprobs": per_token(),
        "values": per_token() if critic else None, "token_rewards": per_token(),
        "advantages": per_token(), "returns": per_token(),
        "bootstrap_value": draw(FLOATS) if critic and truncated else None,
        "group_id": None if critic else "g1",
    }
    return record


def _split(rows: list[dict], cuts: list[int]) -> list[list[dict]]:
    """Rows over up to three files, as ranks' parts are."""
    cuts = sorted({c % (len(rows) + 1) for c in cuts} | {0, len(rows)})
    return [rows[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]


def _write(parts: list[list[dict]], directory: Path) -> list[Path]:
    return [write_samples(part, directory / f"s{k}.parquet") for k, part in enumerate(parts)]


TRAINING_LISTS = ("old_logprobs", "ref_logprobs", "values", "advantages", "returns")


def assert_batch_holds(batch: TurnBatch, samples: list[dict], whiten: bool, critic: bool) -> None:
    """Everything the update reads from a batch, and the micro-batch tensors it trains on, as the
    samples say (docs/design.md §4): a token trains when its loss_mask is 1 and its reply was not
    aborted; a sample with no such token is an aborted row; advantages are whitened over every
    trained token of the batch (biased std); a critic-free batch has zero values."""
    assert batch.prompt_ids == [s["prompt_ids"] for s in samples]
    assert batch.response_ids == [s["response_ids"] for s in samples]
    masks = []
    for s in samples:
        mask = np.asarray(s["loss_mask"], dtype=bool)
        for reply in s["replies"]:
            if reply["aborted"]:
                mask[reply["start"]:reply["end"]] = False
        masks.append(mask)
    assert set(batch.columns) == set(TRAINING_LISTS)
    for name in TRAINING_LISTS:
        for got, s in zip(batch.columns[name], samples, strict=True):
            want = (np.asarray(s[name], dtype=np.float32) if critic or name != "values"
                    else np.zeros(len(s["response_ids"]), dtype=np.float32))
            assert got.dtype == np.float32 and np.array_equal(got, want), name
    assert batch.aborted.tolist() == [not m.any() for m in masks]
    for i, mask in enumerate(masks):
        assert np.array_equal(batch.loss_tokens(i), mask)
    advantages = [np.asarray(s["advantages"], dtype=np.float64) for s in samples]
    if whiten:
        trained = np.concatenate([a[m] for a, m in zip(advantages, masks)])
        mean, var = trained.mean(), trained.var()
        advantages = [np.where(m, (a - mean) / np.sqrt(var + 1e-8), a)
                      for a, m in zip(advantages, masks)]
    for got, want in zip(batch.whitened, advantages, strict=True):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    frames = [list(zip(s["image_starts"] or [], s["images"] or [])) for s in samples]
    assert batch.images == (frames if any(frames) else None)
    assert batch.has_values == critic
    everything = list(range(len(samples)))
    assert batch.n_tokens(everything) == sum(int(m.sum()) for m in masks)
    micro = batch.select(everything)
    width = max(len(s["response_ids"]) for s in samples)
    assert micro.mask.shape == (len(samples), width)
    for i, (s, mask) in enumerate(zip(samples, masks)):
        n = len(s["response_ids"])
        assert micro.mask[i, :n].tolist() == mask.tolist() and not micro.mask[i, n:].any()
        assert torch.equal(micro.advantages[i, :n], torch.tensor(batch.whitened[i]))
        for name in ("old_logprobs", "ref_logprobs", "values", "returns"):
            assert torch.equal(getattr(micro, name)[i, :n],
                               torch.tensor(batch.columns[name][i])), name
            assert not getattr(micro, name)[i, n:].any(), name
    if micro.images is not None:
        for got, want in zip(micro.images, frames):
            assert [start for start, _ in got] == [start for start, _ in want]


@SETTINGS
@given(critic=st.booleans(), whiten=st.booleans(), data=st.data(),
       cuts=st.lists(st.integers(0, 20), max_size=2))
def test_turn_rows_as_samples_train_as_they_say(critic, whiten, data, cuts) -> None:
    rows = data.draw(st.lists(turn_rows(critic), min_size=1, max_size=8))
    if all(r["aborted"] for r in rows):
        rows[0]["aborted"] = False
    samples = samples_from_turns(rows)
    with tempfile.TemporaryDirectory() as tmp:
        batch = read_sample_batch(_write(_split(samples, cuts), Path(tmp)), whiten, critic)
    assert_batch_holds(batch, samples, whiten, critic)
    assert batch.aborted.tolist() == [r["aborted"] for r in rows]


@SETTINGS
@given(critic=st.booleans(), whiten=st.booleans(), data=st.data(),
       cuts=st.lists(st.integers(0, 20), max_size=2))
def test_conversation_records_as_samples_train_as_they_say(critic, whiten, data, cuts) -> None:
    records = data.draw(st.lists(sequence_records(critic), min_size=1, max_size=6))
    if not any(r["segment_starts"] for r in records):
        records[0] = data.draw(sequence_records(critic).filter(lambda r: r["segment_starts"]))
    samples = samples_from_episodes(records)
    with tempfile.TemporaryDirectory() as tmp:
        batch = read_sample_batch(_write(_split(samples, cuts), Path(tmp)), whiten, critic)
    assert_batch_holds(batch, samples, whiten, critic)
    for i, record in enumerate(records):  # the sampled tokens, where the episode had them
        first = record["segment_starts"][0] if record["segment_starts"] else len(
            record["input_ids"]) - 1
        assert batch.prompt_ids[i] + batch.response_ids[i] == record["input_ids"]
        assert batch.loss_tokens(i).tolist() == [bool(m) for m in record["loss_mask"][first:]]


@SETTINGS
@given(critic=st.booleans(), data=st.data())
def test_a_v2_file_keeps_every_column(critic, data) -> None:
    samples = (samples_from_turns(data.draw(st.lists(turn_rows(critic), max_size=4)))
               + samples_from_episodes(data.draw(st.lists(sequence_records(critic),
                                                          max_size=4))))
    with tempfile.TemporaryDirectory() as tmp:
        back = pq.read_table(write_samples(samples, Path(tmp) / "s.parquet")).to_pylist()
    assert back == samples
    assert all(list(s) == SAMPLE_SCHEMA.names for s in samples)


def test_an_episode_maps_onto_its_replies_as_the_contract_says() -> None:
    record = {"episode_id": "s0", "input_ids": [5, 6, 7, 8, 9, 10, 11, 12],
              "loss_mask": [0, 0, 1, 1, 0, 0, 1, 0], "segment_starts": [2, 6],
              "segment_ends": [4, 7], "segment_rewards": [0.25, 1.0], "truncated": True,
              "termination": "max_assistant_turns", "success": False, "bootstrap_value": 0.5,
              "image_starts": [4], "images": [PNGS[0]]}
    sample = sample_from_episode(record)
    assert (sample["prompt_ids"], sample["response_ids"]) == ([5, 6], [7, 8, 9, 10, 11, 12])
    assert sample["loss_mask"] == [1, 1, 0, 0, 1, 0]
    assert sample["env_index"] is None and sample["bootstrap_prompt_ids"] is None
    assert sample["image_starts"] == [4]  # positions into prompt + response: unchanged
    first, last = sample["replies"]
    assert (first["start"], first["end"], last["start"], last["end"]) == (0, 2, 4, 5)
    assert (first["observation"], last["observation"]) == ("5 6", "9 10")
    assert (first["reward"], last["reward"]) == (0.25, 1.0)
    assert (first["truncated"], first["termination"], first["next_value"]) == (False, None, None)
    assert (last["terminated"], last["truncated"], last["termination"], last["next_value"]) == (
        False, True, "max_assistant_turns", 0.5)
    no_reply = sample_from_episode({**record, "segment_starts": [], "segment_ends": [],
                                    "segment_rewards": [], "loss_mask": [0] * 8})
    assert (no_reply["prompt_ids"], no_reply["response_ids"]) == ([5, 6, 7, 8, 9, 10, 11], [12])
    assert (no_reply["loss_mask"], no_reply["replies"]) == ([0], [])


def test_an_aborted_reply_of_a_packed_sample_is_out_of_the_loss(tmp_path: Path) -> None:
    """v2 only: an env failure inside a packed episode masks that reply, not the sample."""
    record = {"episode_id": "s0", "input_ids": list(range(10)),
              "loss_mask": [0, 0, 1, 1, 0, 1, 1, 0, 1, 0], "segment_starts": [2, 5, 8],
              "segment_ends": [4, 7, 9], "segment_rewards": [0.0, 0.0, 1.0], "truncated": False}
    for name in ("old_logprobs", "ref_logprobs", "values", "advantages", "returns"):
        record[name] = [float(k) for k in range(10)]
    sample = sample_from_episode(record)
    sample["replies"][1]["aborted"] = True
    batch = read_sample_batch([write_samples([sample], tmp_path / "s.parquet")])
    assert batch.loss_tokens(0).tolist() == [1, 1, 0, 0, 0, 0, 1, 0]
    assert not batch.aborted[0] and batch.n_tokens([0]) == 3


def test_a_v1_file_is_refused_in_one_line(tmp_path: Path) -> None:
    row = {"prompt_ids": [1], "response_ids": [2]}
    path = write_arrow(rows_table([row], None), tmp_path / "turns.parquet",
                       file_metadata(version=V1_SCHEMA_VERSION))
    with pytest.raises(TrajectoryFileError) as err:
        read_sample_batch([path])
    assert str(err.value) == (f"{path} was written by schema version 1 (before one sample "
                              "schema): rerun the stage that wrote it")


@settings(max_examples=60, deadline=None)
@given(record=sequence_records(critic=True).filter(lambda r: r["segment_starts"]),
       at=st.integers(0, 10_000))
def test_a_loss_token_outside_the_replies_is_refused_by_the_writer(record, at) -> None:
    sample = sample_from_episode(record)
    mask = sample["loss_mask"]
    mask[at % len(mask)] = 1 - mask[at % len(mask)]
    with tempfile.TemporaryDirectory() as tmp, pytest.raises(ValueError,
                                                             match="do not tile its loss"):
        write_samples([sample], Path(tmp) / "s.parquet")


@pytest.mark.parametrize("spans, why", [
    ([(1, 3)], "the first reply starts at 0"), ([(0, 2), (1, 3)], "out of order"),
    ([(0, 4)], "outside its 3 response tokens"), ([(0, None)], "spans"),
])
def test_replies_out_of_order_or_bounds_are_refused_by_the_writer(spans, why,
                                                                  tmp_path: Path) -> None:
    sample = sample_from_turn({"prompt_ids": [1], "response_ids": [2, 3, 4]})
    sample["replies"] = [{"start": s, "end": e} for s, e in spans]
    with pytest.raises(ValueError, match=why):
        write_samples([sample], tmp_path / "s.parquet")


def test_unscored_and_all_aborted_batches_are_refused(tmp_path: Path) -> None:
    row = {"prompt_ids": [1], "response_ids": [2, 3]}
    unscored = write_samples([sample_from_turn(row)], tmp_path / "eval.parquet")
    with pytest.raises(TrajectoryFileError, match="column 'old_logprobs' has nulls"):
        read_sample_batch([unscored])
    scored = {**row, **{k: [0.0, 0.0] for k in ("old_logprobs", "ref_logprobs", "values",
                                                 "advantages", "returns")}, "aborted": True}
    path = write_samples([sample_from_turn(scored)], tmp_path / "aborted.parquet")
    with pytest.raises(ValueError, match="nothing to train on"):
        read_sample_batch([path])
