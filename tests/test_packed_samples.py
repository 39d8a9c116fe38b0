"""Episodes packed as one sample (rollout/samples.py: the context before the first reply is the
prompt, the rest the response) score like their replies one by one and like the engine that
sampled them, and the batch read back from their file (read_sample_batch) trains exactly the
sampled tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from longturn.algo.batches import read_sample_batch
from longturn.engines.hf import HFEngine
from longturn.engines.logprobs import pack_prompt_response, response_logits, token_logprobs
from longturn.rollout.samples import samples_from_episodes
from longturn.rollout.conversation_rollout import conversation_rollout
from longturn.tasks.arithmetic import task_record
from longturn.tasks.interactions import load_interactions
from longturn.tasks.tools import ToolBox, load_tools
from longturn.trajectories import write_samples
from settings_from_params import sampling_settings, conversation_settings

ROOT = Path(__file__).resolve().parents[1]


def logprobs_of(model, batch):
    with torch.no_grad():
        return token_logprobs(response_logits(model, batch), batch.response_ids).masked_fill(
            ~batch.response_mask, 0.0)


def test_packed_samples_score_like_their_replies_and_like_the_engine(tiny_model_dir, tmp_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = HFEngine(tiny_model_dir, dtype="float32")
    settings = conversation_settings(
        tools=ToolBox(load_tools(ROOT / "configs/calculator_tools.yaml")),
        interaction=load_interactions(ROOT / "configs/revision_interactions.yaml")["revise"],
        max_assistant_turns=3, max_user_turns=1, max_tokens=2048, progress=False)
    sampling = sampling_settings(max_new_tokens=10, temperature=1.0, seed=3)
    records = conversation_rollout(engine, tok, sampling, [task_record(s) for s in range(4)], settings)
    assert any(len(r["segment_starts"]) > 1 for r in records)  # a gap of context to cross
    samples = samples_from_episodes(records)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    pad = tok.pad_token_id
    batch = pack_prompt_response([s["prompt_ids"] for s in samples],
                                 [s["response_ids"] for s in samples], pad)
    packed = logprobs_of(model, batch)
    for i, (rec, sample) in enumerate(zip(records, samples)):
        ids, first = rec["input_ids"], rec["segment_starts"][0]
        assert sample["prompt_ids"] + sample["response_ids"] == ids
        assert len(sample["prompt_ids"]) == first
        assert sample["loss_mask"] == rec["loss_mask"][first:]
        mask = torch.tensor(sample["loss_mask"], dtype=torch.bool)
        scored = packed[i, : len(mask)] * mask
        for reply, start, end in zip(sample["replies"], rec["segment_starts"],
                                     rec["segment_ends"]):
            assert (reply["start"], reply["end"]) == (start - first, end - first)
            one = pack_prompt_response([ids[:start]], [ids[start:end]], pad)
            alone = logprobs_of(model, one)[0, : end - start]
            assert torch.allclose(scored[reply["start"]:reply["end"]], alone, atol=1e-4)
            # the engine's logprobs (T = 1, untempered) of the same sampled tokens
            assert torch.allclose(torch.tensor(rec["engine_logprobs"][start:end]), alone,
                                  atol=1e-3)
        sample["old_logprobs"] = scored.tolist()
        for name in ("ref_logprobs", "values", "advantages", "returns"):
            sample[name] = [float(m) for m in sample["loss_mask"]]
    trained = read_sample_batch([write_samples(samples, tmp_path / "part.parquet")])
    everything = list(range(len(samples)))
    micro = trained.select(everything)
    assert trained.n_tokens(everything) == int(micro.mask.sum()) == sum(
        sum(r["loss_mask"]) for r in records)
    for i, sample in enumerate(samples):
        assert trained.loss_tokens(i).tolist() == [bool(m) for m in sample["loss_mask"]]
        n = len(sample["response_ids"])
        np.testing.assert_array_equal(micro.old_logprobs[i, :n].numpy(),
                                      np.asarray(sample["old_logprobs"], dtype=np.float32))
        assert not micro.mask[i, n:].any()
