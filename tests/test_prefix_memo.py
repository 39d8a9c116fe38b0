"""Prefix passes kept across batches: the trunk's for the whole run, each branch's within one
scoring call. A kept pass gives bit-identical outputs, is dropped when the weights change, and is
never used where gradients flow."""

from __future__ import annotations

import torch

from longturn.algo.model_set import ModelSet
from longturn.engines.prefix_memo import PrefixMemo
from longturn.engines.logprobs import pack_prompt_response
from test_trunk import PAD, PROMPTS, RESPONSES, _models

OTHER = [[p + 1 if i < 40 else p for i, p in enumerate(row)] for row in PROMPTS]  # new prefix


def _scores(models: ModelSet, prompts: list[list[int]]) -> list[torch.Tensor]:
    batch = pack_prompt_response(prompts, RESPONSES, PAD, share_prefix=True)
    with torch.no_grad():
        trunk = models.trunk(batch)
        old, _ = models.policy_logprobs(batch, trunk, 0.7)
        ref, _ = models.policy_logprobs(batch, trunk, 0.7, reference=True)
        return [old, ref, models.values(batch, trunk)]


def test_kept_passes_give_the_same_bits_and_run_once(tiny_model_dir) -> None:
    actor, critic = _models(tiny_model_dir, top_layers=1)
    fresh = [_scores(ModelSet(actor, None, critic), PROMPTS) for _ in range(2)]
    models = ModelSet(actor, None, critic)
    with models.scoring():
        first = _scores(models, PROMPTS)
        again = _scores(models, PROMPTS)
        memo = models._branch_prefixes
        assert (memo.misses, memo.hits) == (3, 3)  # actor, reference, critic: once each
    for got in (first, again):
        for a, b in zip(got, fresh[0]):
            assert torch.equal(a, b)
    assert (models.trunk_prefixes.misses, models.trunk_prefixes.hits) == (1, 1)
    assert models._branch_prefixes is None  # the branches' passes end with the scoring call
    _scores(models, OTHER)  # another prefix is another pass
    assert models.trunk_prefixes.misses == 2


def test_changed_weights_are_not_served_a_kept_pass(tiny_model_dir) -> None:
    actor, critic = _models(tiny_model_dir, top_layers=1)
    models = ModelSet(actor, None, critic)
    with models.scoring():
        before = _scores(models, PROMPTS)
        with torch.no_grad():  # an optimizer step changes the adapters in place
            for name, param in actor.named_parameters():
                if "lora_B" in name:
                    param.add_(0.1)
        after = _scores(models, PROMPTS)
        assert models._branch_prefixes.hits == 1  # the critic (the reference: the actor's modules)
    want = _scores(ModelSet(actor, None, critic), PROMPTS)
    for a, b in zip(after, want):
        assert torch.equal(a, b)
    assert not torch.equal(after[0], before[0])
    trunk_params = list(models.actor_decoder.layers[0].parameters())
    with torch.no_grad():
        trunk_params[0].mul_(1.0)  # any in-place write counts, even one that changes nothing
    _scores(models, PROMPTS)
    assert models.trunk_prefixes.misses == 2


def test_passes_with_grad_are_run_every_time(tiny_model_dir) -> None:
    actor, critic = _models(tiny_model_dir, top_layers=1)
    models = ModelSet(actor, None, critic)
    batch = pack_prompt_response(PROMPTS, RESPONSES, PAD, share_prefix=True)
    with models.scoring():
        for _ in range(2):
            trunk = models.trunk(batch)
            models.actor_logits(batch, trunk).sum().backward()
        assert models._branch_prefixes.misses == models._branch_prefixes.hits == 0
    grads = [p.grad for n, p in actor.named_parameters() if "lora" in n and p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_memo_keeps_only_its_capacity() -> None:
    memo, runs = PrefixMemo(capacity=2), []
    layer = torch.nn.Linear(2, 2)
    for token in (1, 2, 1, 3, 1, 2):
        memo.get("trunk", torch.tensor([[token]]), [layer], lambda t=token: runs.append(t) or t)
    assert runs == [1, 2, 3, 2]  # 2 was evicted by 3 (1 had been used again)
