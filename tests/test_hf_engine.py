"""HFEngine: exact raw-policy logprobs, stop handling, greedy/seeded determinism, no hidden top-k."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from longturn.engines.hf import HFEngine
from longturn.engines.static_decoder import prefill_chunks
from longturn.engines.row_seeds import row_seed
from longturn.engines.sampler import filter_logits, sample_tokens
from longturn.engines.shared_prefix import shared_prefix_length
from longturn.engines.logprobs import pack_prompt_response, response_logits
from reference_forward import forward_logprobs, response_logprobs_tensor
from settings_from_params import sampling_settings


def make_prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    """Random token ids (away from the special tokens at the start of the vocab)."""
    rng = random.Random(seed)
    return [[rng.randrange(100, 40000) for _ in range(n)] for n in lengths]


PROMPTS = make_prompts([3, 17, 41, 9])


def stopping_at(model_dir: str, stops: list[int], out: Path) -> str:
    """A copy of the model dir whose generation config also ends a turn at `stops` (the engine
    reads its end-of-turn ids from the tokenizer and the generation config)."""
    shutil.copytree(model_dir, out)
    path = out / "generation_config.json"
    config = json.loads(path.read_text())
    config["eos_token_id"] = [config["eos_token_id"], *stops]
    path.write_text(json.dumps(config))
    return str(out)


@pytest.fixture(scope="module")
def engine32(tiny_model_dir: str) -> HFEngine:
    return HFEngine(tiny_model_dir, dtype="float32")


@pytest.fixture(scope="module")
def ref_model(tiny_model_dir: str) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.mark.parametrize(
    "sampling",
    [
        sampling_settings(max_new_tokens=12, temperature=1.0, seed=1),
        sampling_settings(max_new_tokens=12, temperature=0.7, top_k=5, top_p=0.9, seed=2),
    ],
)
def test_logprobs_are_raw_policy_forward(engine32, ref_model, sampling) -> None:
    """Mixed prompt lengths in one batch: left padding and KV cache change nothing."""
    completions = engine32.generate(PROMPTS, sampling)
    responses = [c.token_ids for c in completions]
    expected = forward_logprobs(ref_model, PROMPTS, responses)
    for completion, ref in zip(completions, expected):
        assert len(completion.logprobs) == len(completion.token_ids) == len(ref)
        assert completion.logprobs == pytest.approx(ref, abs=1e-4)


def test_bf16_engine_close_to_fp32_forward(tiny_model_dir, ref_model) -> None:
    engine = HFEngine(tiny_model_dir, dtype="bfloat16")
    completions = engine.generate(PROMPTS, sampling_settings(max_new_tokens=8, seed=3))
    expected = forward_logprobs(ref_model, PROMPTS, [c.token_ids for c in completions])
    for completion, ref in zip(completions, expected):
        assert completion.logprobs == pytest.approx(ref, abs=5e-2)


def test_forward_logprobs_padding_invariant(ref_model) -> None:
    """Alone or batched with longer prompts/responses, a pair gets the same logprobs."""
    responses = make_prompts([5, 1, 11, 0], seed=1)
    batched = forward_logprobs(ref_model, PROMPTS, responses)
    for prompt, response, row in zip(PROMPTS, responses, batched):
        alone = forward_logprobs(ref_model, [prompt], [response])[0]
        assert row == pytest.approx(alone, abs=1e-5)
    assert batched[3] == []


def test_tensor_variant_has_grad_and_mask(ref_model) -> None:
    responses = make_prompts([4, 2], seed=2)
    logprobs, mask = response_logprobs_tensor(ref_model, PROMPTS[:2], responses)
    assert logprobs.shape == mask.shape == (2, 4)
    assert mask.tolist() == [[True] * 4, [True, True, False, False]]
    assert logprobs.requires_grad and float(logprobs.detach()[1, 2:].abs().sum()) == 0.0
    logprobs.sum().backward()
    assert ref_model.model.embed_tokens.weight.grad is not None
    ref_model.zero_grad(set_to_none=True)


def test_greedy_is_argmax_and_deterministic(engine32, ref_model) -> None:
    greedy = sampling_settings(max_new_tokens=10, temperature=0.0)
    first = engine32.generate(PROMPTS, greedy)
    assert [c.token_ids for c in engine32.generate(PROMPTS, greedy)] == [
        c.token_ids for c in first
    ]
    responses = [c.token_ids for c in first]
    batch = pack_prompt_response(PROMPTS, responses)
    with torch.inference_mode():
        argmax = response_logits(ref_model, batch).argmax(-1)
    for row, response in enumerate(responses):
        assert argmax[row, : len(response)].tolist() == response


def test_stop_token_included_and_length_reason(tiny_model_dir, engine32, tmp_path) -> None:
    greedy = sampling_settings(max_new_tokens=10, temperature=0.0)
    free = engine32.generate(PROMPTS, greedy)
    assert all(c.finish_reason == "length" and len(c.token_ids) == 10 for c in free)
    stop = free[1].token_ids[4]
    cut = free[1].token_ids.index(stop) + 1
    stopping = HFEngine(stopping_at(tiny_model_dir, [stop], tmp_path / "m"), dtype="float32")
    assert stop in stopping.stop_ids and stopping.tokenizer.eos_token_id in stopping.stop_ids
    out = stopping.generate(PROMPTS, greedy)
    assert out[1].token_ids == free[1].token_ids[:cut]
    assert out[1].finish_reason == "stop"
    assert len(out[1].logprobs) == cut
    for before, after in zip(free, out):
        if stop not in before.token_ids:
            assert after.token_ids == before.token_ids and after.finish_reason == "length"


def test_seed_reproducible_and_independent_of_micro_batches(tiny_model_dir, engine32) -> None:
    sampling = sampling_settings(max_new_tokens=16, temperature=1.0, seed=123)
    first = [c.token_ids for c in engine32.generate(PROMPTS, sampling)]
    assert [c.token_ids for c in engine32.generate(PROMPTS, sampling)] == first
    other = sampling_settings(max_new_tokens=16, temperature=1.0, seed=124)
    assert [c.token_ids for c in engine32.generate(PROMPTS, other)] != first
    micro = HFEngine(tiny_model_dir, dtype="float32", batch_size=3)
    assert [c.token_ids for c in micro.generate(PROMPTS, sampling)] == first


def test_a_prompt_with_its_own_seed_samples_the_same_whatever_shares_its_call(engine32) -> None:
    """Evaluation episodes carry their own seeds: what a prompt draws must not depend on the
    other prompts of the call or on its index (a resumed evaluation batches them otherwise)."""
    seeds = (11, 22, 33, 44)
    together = engine32.generate(PROMPTS, sampling_settings(max_new_tokens=16, seed=seeds))
    alone = engine32.generate([PROMPTS[2]], sampling_settings(max_new_tokens=16, seed=(33,)))
    shuffled = engine32.generate([PROMPTS[3], PROMPTS[2]],
                                 sampling_settings(max_new_tokens=16, seed=(44, 33)))
    assert alone[0].token_ids == shuffled[1].token_ids == together[2].token_ids
    assert shuffled[0].token_ids == together[3].token_ids
    assert engine32.generate(PROMPTS, sampling_settings(max_new_tokens=16, seed=1)) != together
    with pytest.raises(ValueError, match="2 sampling seeds for 4 prompts"):
        engine32.generate(PROMPTS, sampling_settings(max_new_tokens=4, seed=(1, 2)))


def test_identical_prompts_get_different_samples(engine32) -> None:
    out = engine32.generate([PROMPTS[0]] * 4, sampling_settings(max_new_tokens=8, seed=5))
    assert len({tuple(c.token_ids) for c in out}) == 4


def test_no_hidden_top_k_and_explicit_top_k(engine32) -> None:
    """One step from one context, 400 draws: top_k=0 reaches far more than 50 distinct tokens."""
    prompts = [PROMPTS[1]] * 400
    full = engine32.generate(prompts, sampling_settings(max_new_tokens=1, temperature=1.0, seed=7))
    assert len({c.token_ids[0] for c in full}) > 100
    top5 = engine32.generate(prompts, sampling_settings(max_new_tokens=1, top_k=5, seed=7))
    with torch.inference_mode():
        logits = engine32.model(torch.tensor([PROMPTS[1]])).logits[0, -1]
    allowed = set(torch.topk(logits, 5).indices.tolist())
    assert {c.token_ids[0] for c in top5} <= allowed


def test_tiny_top_p_is_greedy(engine32) -> None:
    nucleus = engine32.generate(PROMPTS, sampling_settings(max_new_tokens=6, top_p=1e-6, seed=9))
    greedy = engine32.generate(PROMPTS, sampling_settings(max_new_tokens=6, temperature=0.0))
    assert [c.token_ids for c in nucleus] == [c.token_ids for c in greedy]


def test_update_weights_changes_outputs(tiny_model_dir, tmp_path) -> None:
    engine = HFEngine(tiny_model_dir, dtype="float32")
    greedy = sampling_settings(max_new_tokens=8, temperature=0.0)
    before = engine.generate(PROMPTS, greedy)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    torch.manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.5)
    model.save_pretrained(tmp_path)
    engine.update_weights(str(tmp_path))
    after = engine.generate(PROMPTS, greedy)
    assert [c.token_ids for c in after] != [c.token_ids for c in before]
    assert after[0].logprobs == pytest.approx(
        forward_logprobs(model.eval(), PROMPTS[:1], [after[0].token_ids])[0], abs=1e-4
    )
    engine.close()
    with pytest.raises(RuntimeError):
        engine.generate(PROMPTS, greedy)


def test_update_weights_rejects_other_architecture(tiny_model_dir, tmp_path) -> None:
    engine = HFEngine(tiny_model_dir, dtype="float32")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model.config.num_hidden_layers = 1
    AutoModelForCausalLM.from_config(model.config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="architecture"):
        engine.update_weights(str(tmp_path))
    assert engine.generate(PROMPTS[:1], sampling_settings(max_new_tokens=2, seed=0))


def test_sampler_matches_distribution_and_filters() -> None:
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3])
    logits = probs.log().expand(4000, 4)
    seeds = torch.tensor([row_seed(7, i) for i in range(4000)])
    draws = sample_tokens(logits, sampling_settings(temperature=1.0), seeds, step=0)
    freq = torch.bincount(draws, minlength=4).double() / 4000
    assert freq[1] == 0 and torch.allclose(freq, probs.double(), atol=0.03)
    kept = filter_logits(probs.log()[None], sampling_settings(top_p=0.65)).isfinite()
    assert kept.tolist() == [[False, False, True, True]]
    kept = filter_logits(probs.log()[None], sampling_settings(top_k=1)).isfinite()
    assert kept.tolist() == [[False, False, True, False]]


SHARED = make_prompts([40], seed=11)[0]
TAILS = make_prompts([1, 7, 23, 2, 12], seed=12)
PREFIX_BATCHES = {
    # suffixes of different lengths, one of a single token
    "tails": [SHARED + tail for tail in TAILS],
    # the first prompt is a prefix of the others: the shared part is cut back to 39 tokens
    "nested": [SHARED, SHARED + TAILS[1], SHARED + TAILS[0], SHARED + TAILS[2]],
}


@pytest.fixture(scope="module")
def engine32_plain(tiny_model_dir: str) -> HFEngine:
    return HFEngine(tiny_model_dir, dtype="float32", prefix_sharing=False)


def prefill_shapes(engine: HFEngine, prompts: list[list[int]]) -> list[tuple[int, int]]:
    """Token-id shapes embedded by a one-token generate: its prefill passes (either decoder)."""
    shapes: list[tuple[int, int]] = []
    embed = engine.model.get_input_embeddings()
    hook = embed.register_forward_pre_hook(lambda _m, args: shapes.append(tuple(args[0].shape)))
    try:
        engine.generate(prompts, sampling_settings(max_new_tokens=1, temperature=0.0))
    finally:
        hook.remove()
    return shapes


def test_shared_prefix_length() -> None:
    a, b = make_prompts([30, 30], seed=13)
    assert shared_prefix_length([SHARED + a, SHARED + b]) == 40
    assert shared_prefix_length([SHARED, SHARED + a]) == 39  # each keeps >= 1 own token
    assert shared_prefix_length([SHARED, SHARED]) == 39
    assert shared_prefix_length([SHARED[:16] + a, SHARED[:16] + b]) == 16
    assert shared_prefix_length([SHARED[:15] + a, SHARED[:15] + b]) == 0  # under the minimum
    assert shared_prefix_length([SHARED[:16], SHARED[:16] + a]) == 0  # 15 after the cut
    assert shared_prefix_length([SHARED + a]) == 0  # nothing to share with
    assert shared_prefix_length([a, b]) == 0


@pytest.mark.parametrize("fast_path", [True, False])
def test_prefix_pass_runs_once_at_batch_size_one(tiny_model_dir, fast_path) -> None:
    shared = HFEngine(tiny_model_dir, dtype="float32", fast_path=fast_path)
    plain = HFEngine(tiny_model_dir, dtype="float32", fast_path=fast_path, prefix_sharing=False)
    assert shared.decoder_name == ("static" if fast_path else "generic")
    batch = PREFIX_BATCHES["nested"]
    tails = [(1, 24), (1, 8), (1, 2), (1, 1)] if fast_path else [(4, 24)]  # static: by width
    assert prefill_shapes(shared, batch) == [(1, 39)] + tails
    if not fast_path:
        assert prefill_shapes(plain, batch) == [(4, 63)]
        assert prefill_shapes(shared, PROMPTS) == [(4, 41)]  # no common prefix: as before
    else:  # rows of like width are prefilled together (static_decoder.prefill_chunks)
        widths = sorted((len(p) for p in PROMPTS), reverse=True)
        expected = [(stop - start, widths[start]) for start, stop in prefill_chunks(widths)]
        assert prefill_shapes(shared, PROMPTS) == expected  # no common prefix: no prefix pass


@pytest.mark.parametrize("name", sorted(PREFIX_BATCHES))
def test_prefix_sharing_matches_plain_prefill(engine32, engine32_plain, ref_model, name) -> None:
    """Greedy and seeded samples are the same with sharing on and off; logprobs are the policy's."""
    prompts = PREFIX_BATCHES[name]
    for sampling in (sampling_settings(max_new_tokens=10, temperature=0.0),
                     sampling_settings(max_new_tokens=12, temperature=1.0, seed=21),
                     sampling_settings(max_new_tokens=12, temperature=0.8, top_p=0.9, seed=22)):
        shared = engine32.generate(prompts, sampling)
        plain = engine32_plain.generate(prompts, sampling)
        assert [c.token_ids for c in shared] == [c.token_ids for c in plain]
        expected = forward_logprobs(ref_model, prompts, [c.token_ids for c in shared])
        for s, p, ref in zip(shared, plain, expected):
            assert s.logprobs == pytest.approx(p.logprobs, abs=1e-4)
            assert s.logprobs == pytest.approx(ref, abs=1e-4)


def test_prefix_sharing_drops_stopped_rows_and_micro_batches(
    tiny_model_dir, engine32_plain, tmp_path
) -> None:
    """Rows that stop early leave the expanded cache; micro-batches each share their own prefix."""
    prompts = PREFIX_BATCHES["tails"]
    greedy = sampling_settings(max_new_tokens=10, temperature=0.0)
    free = engine32_plain.generate(prompts, greedy)
    stop = free[2].token_ids[3]
    model_dir = stopping_at(tiny_model_dir, [stop], tmp_path / "m")
    plain = HFEngine(model_dir, dtype="float32", prefix_sharing=False).generate(prompts, greedy)
    for batch_size in (None, 2):
        engine = HFEngine(model_dir, dtype="float32", batch_size=batch_size)
        shared = engine.generate(prompts, greedy)
        assert [c.token_ids for c in shared] == [c.token_ids for c in plain]
        assert [c.finish_reason for c in shared] == [c.finish_reason for c in plain]
        for s, p in zip(shared, plain):
            assert s.logprobs == pytest.approx(p.logprobs, abs=1e-4)
    assert plain[2].finish_reason == "stop"
    assert any(c.finish_reason == "length" for c in plain)
