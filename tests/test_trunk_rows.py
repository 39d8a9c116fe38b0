"""Scoring keeps each row's frozen-trunk output and the update assembles its micro-batches from
it: the same hidden states however the rows are packed next (another prefix, other neighbours),
the same update as one that runs the trunk again, and a fresh pass whenever a row was not kept or
the trunk's weights changed."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Callable

import pytest
import torch
from transformers import AutoTokenizer

from longturn.algo.model_set import ModelSet
from longturn.algo.trainer import PPOTrainer
from longturn.engines.logprobs import pack_prompt_response
from turn_rows import samples_from_turns
from longturn.trajectories import write_samples
from test_trunk import PAD, PROMPTS, RESPONSES, SHARED, _models
from test_trainer import GAE, SETTINGS, critic_dir  # noqa: F401 (fixture)
from two_rank_update import make_rows

# row 3 shares two more tokens with row 0 than the batch shares: a longer prefix than scoring's
ROWS = list(zip(PROMPTS + [SHARED + [5, 17, 1, 1]], RESPONSES + [[21, 22]]))


def _trunk(models: ModelSet, rows: list, share_prefix: bool) -> tuple[torch.Tensor, torch.Tensor]:
    prompts, responses = map(list, zip(*rows))
    batch = pack_prompt_response(prompts, responses, PAD, share_prefix=share_prefix)
    return models.trunk(batch).hidden, batch.attention_mask[:, -batch.input_ids.shape[1]:].bool()


def test_kept_rows_give_the_trunk_of_any_packing(tiny_model_dir) -> None:
    actor, critic = _models(tiny_model_dir, top_layers=1)
    models, fresh = ModelSet(actor, None, critic), ModelSet(actor, None, critic,
                                                            keep_trunk_rows=False)
    kept = models.trunk_rows
    with kept.keeping():
        _trunk(models, ROWS, share_prefix=True)  # scoring: a 40-token prefix
    for picked, share in (([2, 0], False), ([3, 0], True), ([1, 3, 2], True)):
        rows = [ROWS[i] for i in picked]
        hits = kept.hits
        got, own = _trunk(models, rows, share)
        want, _ = _trunk(fresh, rows, share)
        assert kept.hits == hits + 1  # assembled, not run
        torch.testing.assert_close(got[own], want[own], atol=1e-5, rtol=1e-5)
    assert kept.nbytes == sum(len(p) + len(r) - 40 for p, r in ROWS) * 64 * 4 + 40 * 64 * 4

    misses = kept.misses
    _trunk(models, [ROWS[0], (PROMPTS[1], [9])], share_prefix=True)  # a row never scored
    with kept.keeping():  # a later scoring call (rows 0 and 1 kept: assembled) drops 2 and 3
        _trunk(models, ROWS[:2], share_prefix=True)
    _trunk(models, ROWS[2:], share_prefix=True)
    with torch.no_grad():  # the trunk's weights written in place: nothing kept holds
        models.actor_decoder.layers[0].mlp.up_proj.weight.mul_(1.0)
    _trunk(models, ROWS[:2], share_prefix=True)
    assert kept.misses == misses + 3


def _trainer(model_dir: str, critic_dir: str, tmp_path) -> tuple[PPOTrainer, str]:
    """A LoRA-top trainer (trunk depth 1, shared prefix, one row per micro-batch) and a batch it
    scored (keeping its rows' trunk outputs)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    settings = replace(SETTINGS, lora=True, lora_r=4, lora_layers=1, share_prefix=True,
                       share_trunk=True, micro_batch_size=1)
    trainer = PPOTrainer(model_dir, critic_dir, settings, GAE, tokenizer)
    assert trainer.models.depth == 1
    rows = make_rows(4, tokenizer, n_slots=3, n_steps=3)
    for row in rows:  # a common system prompt, as agent prompts have
        for key in ("prompt_ids", "bootstrap_prompt_ids"):
            if row.get(key):
                row[key] = SHARED + row[key]
    path = write_samples(trainer.score(samples_from_turns(rows)), tmp_path / "b.parquet")
    return trainer, str(path)


def _rewind(trainer: PPOTrainer) -> Callable[[], None]:
    """Puts the trainer back where it is now: trainable weights, Adam state, update count."""
    engines = [trainer.actor_engine, trainer.critic_engine]
    weights = [{n: p.detach().clone() for n, p in e.module.named_parameters() if p.requires_grad}
               for e in engines]
    states = [copy.deepcopy(e.optimizer.state_dict()) for e in engines]

    def rewind() -> None:
        with torch.no_grad():
            for engine, kept, state in zip(engines, weights, states):
                for name, param in engine.module.named_parameters():
                    if name in kept:
                        param.copy_(kept[name])
                engine.optimizer.load_state_dict(state)
        trainer.updates = 0
    return rewind


def _trained(trainer: PPOTrainer) -> dict[str, torch.Tensor]:
    return {f"{tag}.{n}": p.detach().clone() for tag, m in
            (("actor", trainer.actor_module), ("critic", trainer.critic_module))
            for n, p in m.named_parameters() if p.requires_grad}


def test_an_update_from_kept_rows_equals_one_that_runs_the_trunk(tiny_model_dir, critic_dir,
                                                                 tmp_path) -> None:
    trainer, path = _trainer(tiny_model_dir, critic_dir, tmp_path)
    kept, rewind = trainer.models.trunk_rows, _rewind(trainer)
    before = _trained(trainer)
    metrics, weights = trainer.update([path]), _trained(trainer)
    assert (kept.hits, kept.misses) == (9, 4)  # each one-row micro-batch; scoring: 3 + bootstraps
    rewind()
    trainer.models.trunk_rows = None  # the trunk runs again, as without a kept row
    want_metrics, want = trainer.update([path]), _trained(trainer)
    for key in ("policy_loss", "value_loss", "grad_norm_actor", "grad_norm_critic", "entropy"):
        assert metrics[key] == pytest.approx(want_metrics[key], rel=1e-5, abs=1e-7), key
    assert max(float((w - want[k]).abs().max()) for k, w in weights.items()) < 5e-5
    assert max(float((w - before[k]).abs().max()) for k, w in weights.items()) > 1e-4  # it moved
