"""Episodes packed as one (prompt, response) row score like their replies one by one, and like
the engine that sampled them: the sequence layout trains exactly the sampled tokens."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from longturn.engines.hf import HFEngine
from longturn.engines.logprobs import pack_prompt_response, response_logits, token_logprobs
from longturn.tasks.interactions import load_interactions
from longturn.algo.sequence_packing import pack_sequences, unpack_tokens
from longturn.rollout.sequence_rollout import sequence_rollout
from longturn.tasks.tools import ToolBox, load_tools
from longturn.tasks.arithmetic import task_record
from settings_from_params import sampling_settings, sequence_settings

ROOT = Path(__file__).resolve().parents[1]


def logprobs_of(model, batch):
    with torch.no_grad():
        return token_logprobs(response_logits(model, batch), batch.response_ids).masked_fill(
            ~batch.response_mask, 0.0)


def test_sequence_rows_score_like_their_replies_and_like_the_engine(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = HFEngine(tiny_model_dir, dtype="float32")
    settings = sequence_settings(
        tools=ToolBox(load_tools(ROOT / "configs/calculator_tools.yaml")),
        interaction=load_interactions(ROOT / "configs/revision_interactions.yaml")["revise"],
        max_assistant_turns=3, max_user_turns=1, max_tokens=2048, progress=False)
    sampling = sampling_settings(max_new_tokens=10, temperature=1.0, seed=3)
    records = sequence_rollout(engine, tok, sampling, [task_record(s) for s in range(4)], settings)
    assert any(len(r["segment_starts"]) > 1 for r in records)  # a gap of context to cross
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    pad = tok.pad_token_id
    batch = pack_sequences(records, pad)
    per_episode = unpack_tokens(batch, records, logprobs_of(model, batch))
    for rec, scored in zip(records, per_episode):
        assert len(scored) == len(rec["input_ids"])
        ids = rec["input_ids"]
        for start, end in zip(rec["segment_starts"], rec["segment_ends"]):
            one = pack_prompt_response([ids[:start]], [ids[start:end]], pad)
            alone = logprobs_of(model, one)[0, : end - start]
            assert torch.allclose(torch.tensor(scored[start:end]), alone, atol=1e-4)
            # the engine's logprobs (T = 1, untempered) of the same sampled tokens
            assert torch.allclose(torch.tensor(rec["engine_logprobs"][start:end]), alone,
                                  atol=1e-3)
        assert all(v == 0.0 for v, m in zip(scored, rec["loss_mask"]) if not m)
    assert int(batch.response_mask.sum()) == sum(sum(r["loss_mask"]) for r in records)
