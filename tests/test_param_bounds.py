"""Sizes and counts in params.yaml have upper bounds, alone and multiplied together; an empty or
non-mapping params file is refused (issue 21: such values used to die in the allocator)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from longturn.params import limits
from longturn.params.config import Params, ParamsError, load_params, parse_params


def bounded_fields(model: Any = Params, prefix: str = "") -> dict[str, int]:
    """Every key of Params with an upper bound, dotted, and the bound."""
    found: dict[str, int] = {}
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        if isinstance(info.annotation, type) and hasattr(info.annotation, "model_fields"):
            found.update(bounded_fields(info.annotation, f"{key}."))
        for meta in info.metadata:
            if getattr(meta, "le", None) is not None:
                found[key] = meta.le
    return found


def nested(key: str, value: Any) -> dict[str, Any]:
    data: dict[str, Any] = {}
    node = data
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return data


# Every size or count a run allocates or loops over: none may be unbounded.
SIZES_AND_COUNTS = {
    "engine.sampling.max_new_tokens", "engine.sampling.top_k", "engine.batch_size",
    "engine.sglang.tp_size", "env.max_turns", "env.max_retries", "prompt.history_turns",
    "prompt.max_prompt_tokens", "eval.episodes_per_task", "eval.parallel_envs",
    "validation.samples_per_task", "rollout.n_envs", "rollout.turns_per_env",
    "rollout.chat.max_assistant_turns", "rollout.chat.max_user_turns",
    "rollout.chat.max_tokens", "rollout.chat.max_tool_response_chars",
    "rollout.chat.tool_timeout_s",
    "algo.group_size", "ppo.ppo_epochs", "ppo.mini_batch_size", "ppo.micro_batch_size",
    "ppo.lora_r", "ppo.lora_layers", "warmup.batches", "warmup.iterations", "train.iterations",
    "train.checkpoint_every", "train.keep_checkpoints", "train.iterations_per_task",
}


def test_every_size_and_count_has_a_bound():
    missing = SIZES_AND_COUNTS - set(bounded_fields())
    assert not missing


@pytest.mark.parametrize("key, bound", sorted(
    (k, b) for k, b in bounded_fields().items() if k in SIZES_AND_COUNTS))
def test_one_over_the_bound_is_refused_naming_key_and_bound(key, bound):
    with pytest.raises(ParamsError) as err:
        parse_params(nested(key, bound + 1), "p.yaml")
    message = str(err.value)
    assert message.startswith(f"p.yaml: key '{key}'")
    assert f"less than or equal to {bound}" in message and "; the bound: " in message
    assert "\n" not in message


@pytest.mark.parametrize("key, value", [
    ("engine.sampling.max_new_tokens", 1_000_000_000_000),
    ("train.iterations", 10**30),
    ("eval.episodes_per_task", 10**30),
])
def test_the_probe_values_are_refused(key, value):
    with pytest.raises(ParamsError, match=rf"key '{key}'.*less than or equal to"):
        parse_params(nested(key, value), "p.yaml")


def test_bound_values_are_accepted_where_nothing_else_multiplies_them():
    params = parse_params({"train": {"iterations": limits.ITERATIONS.value},
                           "eval": {"episodes_per_task": limits.EPISODES.value}})
    assert params.train.iterations == 10**6 and params.eval.episodes_per_task == 10**7


def refused(data: dict[str, Any]) -> str:
    with pytest.raises(ParamsError) as err:
        parse_params(data, "p.yaml")
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_history_longer_than_the_prompt_budget_is_refused():
    message = refused({"prompt": {"history_turns": 300, "max_prompt_tokens": 256}})
    assert "prompt.history_turns (300)" in message and "prompt.max_prompt_tokens (256)" in message


def test_a_turn_longer_than_any_context_is_refused():
    message = refused({"prompt": {"max_prompt_tokens": 2**17},
                       "engine": {"sampling": {"max_new_tokens": 1}}})
    assert "prompt.max_prompt_tokens + engine.sampling.max_new_tokens (131,073)" in message
    assert "131,072" in message


@pytest.mark.parametrize("key", ["engine.batch_size", "ppo.micro_batch_size"])
def test_a_forward_that_no_gpu_holds_is_refused(key):
    data = nested(key, 4096)
    data.setdefault("prompt", {})["max_prompt_tokens"] = 4096
    if key == "ppo.micro_batch_size":
        data["ppo"]["mini_batch_size"] = 4096
    message = refused(data)
    assert f"{key} (4,096) × (prompt.max_prompt_tokens + engine.sampling.max_new_tokens)" in message
    assert f"over {limits.FORWARD_TOKENS.value:,}" in message


def test_an_iteration_no_rank_holds_is_refused_naming_every_factor():
    message = refused({"rollout": {"n_envs": 64, "turns_per_env": 4000},
                       "prompt": {"max_prompt_tokens": 1024},
                       "engine": {"sampling": {"max_new_tokens": 64}}})
    for factor in ("rollout.n_envs (64)", "rollout.turns_per_env (4,000)", "warmup.batches (1)"):
        assert factor in message
    assert f"= {64 * 4000 * 1088:,} is over {limits.HELD_TOKENS.value:,}" in message


def test_the_warm_up_keeps_all_its_batches():
    ok = {"rollout": {"n_envs": 64, "turns_per_env": 64}}
    assert parse_params(ok).warmup.batches == 1
    message = refused({**ok, "warmup": {"batches": 4000}})
    assert "warmup.batches (4,000)" in message


def test_conversations_size_rows_by_their_budget_and_context():
    # the whole episode: one packed row per episode
    message = refused({"rollout": {"protocol": "chat", "context": "episode", "n_envs": 4096,
                                   "chat": {"max_tokens": 2**17}}})
    assert "rollout.n_envs (4,096) × rollout.chat.max_tokens (131,072)" in message
    # a window: a row per reply, so the replies of an episode multiply (critic-free: whole
    # episodes; with a critic, fixed-turn batches of turns_per_env replies a slot)
    windowed = {"rollout": {"protocol": "chat", "context": "window", "n_envs": 64,
                            "turns_per_env": 64,
                            "chat": {"max_tokens": 2**17, "max_assistant_turns": 64}},
                "algo": {"advantage": "grpo", "group_size": 4}}
    assert ("rollout.n_envs (64) × rollout.chat.max_assistant_turns (64) × "
            "rollout.chat.max_tokens (131,072)") in refused(windowed)
    windowed["algo"] = {"advantage": "gae"}
    assert ("rollout.n_envs (64) × rollout.turns_per_env (64) × "
            "rollout.chat.max_tokens (131,072)") in refused(windowed)
    windowed["rollout"]["context"] = "episode"
    assert parse_params(windowed).rollout.n_envs == 64


def test_the_settings_of_earlier_versions_are_refused_with_their_replacement():
    for old, new in (("mode", "rollout.protocol"), ("sequence", "rollout.chat")):
        message = refused({"rollout": {old: {}}})
        assert new in message and "\n" not in message.strip(), message


def test_critic_free_iterations_are_sized_by_the_episode_limit():
    data = {"algo": {"advantage": "grpo", "group_size": 4},
            "rollout": {"n_envs": 4096, "turns_per_env": 1}, "env": {"max_turns": 100}}
    assert "rollout.n_envs (4,096) × env.max_turns (100)" in refused(data)
    data["env"]["max_turns"] = None  # the env's own limit: unknown here, not refused
    assert parse_params(data).rollout.n_envs == 4096


@pytest.mark.parametrize("text, says", [
    ("", "is empty"), ("null\n", "is empty"), ("# only a comment\n", "is empty"),
    ("- seed\n", "holds a YAML list, not a mapping"), ("3\n", "holds a YAML int, not a mapping"),
    ("params\n", "holds a YAML str, not a mapping"),
])
def test_an_empty_or_non_mapping_params_file_is_refused_naming_it(tmp_path, text, says):
    path = tmp_path / "params.yaml"
    path.write_text(text)
    with pytest.raises(ParamsError) as err:
        load_params(path)
    assert str(err.value).startswith(f"{path} {says}")
    assert "longturn params default" in str(err.value)


SEED_KEYS = ("seed", "eval.seed", "validation.seed")


def test_every_seed_has_a_bound():
    assert set(SEED_KEYS) <= set(bounded_fields())


@pytest.mark.parametrize("key", SEED_KEYS)
@pytest.mark.parametrize("value", [2**32, 2**64])
def test_a_seed_past_what_env_resets_and_torch_take_is_refused(key, value):
    message = refused(nested(key, value))
    assert message.startswith(f"p.yaml: key '{key}'") and "numpy RandomState" in message


def test_the_highest_seeds_leave_every_episode_a_reset_seed_below_2_to_the_32():
    top, most = limits.SEED.value, limits.EPISODES.value
    params = parse_params({"seed": top, "eval": {"seed": top, "episodes_per_task": most},
                           "validation": {"seed": top, "samples_per_task": most}})
    for last in (params.eval.seed + params.eval.episodes_per_task - 1,
                 params.validation.seed + params.validation.samples_per_task - 1):
        np.random.RandomState(last)  # the last episode's reset seed is one RandomState takes
    with pytest.raises(ValueError):
        np.random.RandomState(top + most + 1)  # and the room left is all there is


@pytest.mark.parametrize("rollout,fixed", [
    ({"protocol": "action"}, True),
    ({"protocol": "action", "context": "episode"}, True),
    ({"protocol": "chat", "context": "window"}, True),
    ({"protocol": "chat", "context": "window",  # named: played and sized as your own
      "chat": {"function": "longturn.rollout.conversation_rollout:conversation_rollout"}}, False),
    ({"protocol": "chat", "context": "window", "chat": {"function": "examples.x:rollout"}}, False),
    ({"protocol": "chat", "context": "episode"}, False),
    ({"protocol": "chat", "context": "episode", "agent": "examples.x:agent"}, True),
])
def test_the_size_check_counts_the_batches_the_collector_plays(rollout, fixed):
    """One rule (Params.collection) for the collector and the size check: with a critic,
    n_envs × turns_per_env rows exactly when the rollout can be cut into fixed-turn batches."""
    from longturn.params.estimator import Collection
    from longturn.params.sizes import iteration_rows

    params = parse_params({"algo": {"advantage": "gae"}, "rollout": rollout})
    assert params.rollout.can_be_cut() is fixed
    assert (params.collection is Collection.FIXED_TURNS) is fixed
    keys = [key for key, _ in iteration_rows(params)]
    assert ("rollout.turns_per_env" in keys) is fixed
