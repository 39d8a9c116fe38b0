"""The four behaviours issue 22 must keep, each a profile at toy size, and the stage command lines
that run it (the stable interface between the tool and either version of the code).

Why one table: a rename of a params key (`rollout.sequence.max_tokens` became
`rollout.chat.max_tokens`) is one edit here. A key may be a tuple of alternative paths: the first one the
tree's written params file has is set, so one table serves the old and the new layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from parity import ParityError

Key = Union[str, tuple[str, ...]]

MODEL_SOURCE: Key = "model.source"
# every case: float32 on the CPU, one iteration of one update, a small warm-up; the tiny models
# have 2 layers, so LoRA on the top one leaves a frozen trunk below it (shared by actor,
# reference and critic, as on the real model)
COMMON: dict[Key, Any] = {
    "model.dtype": "float32",
    "engine.batch_size": 4,
    "rollout.n_envs": 2,
    "ppo.bf16": False,
    "ppo.lora_layers": 1,
    "warmup.batches": 1,
    "warmup.iterations": 1,
    "train.iterations": 1,
}
# --tiny only: a random model's replies are noise, so short ones say as much as long ones
TINY: dict[Key, Any] = {
    "engine.sampling.max_new_tokens": 8,
}


@dataclass(frozen=True)
class Case:
    letter: str
    name: str
    profile: str  # written by the tree's own `longturn params PROFILE`
    critic: bool  # run critic_warmup (GAE); critic-free estimators skip it
    vision: bool = False  # played on a LLaVA-layout model
    overrides: dict[Key, Any] = field(default_factory=dict)


CASES = (
    Case("a", "default", "default", critic=True, overrides={
        "env.max_turns": 3, "rollout.turns_per_env": 3,
        "ppo.mini_batch_size": 6, "ppo.micro_batch_size": 3}),
    Case("b", "tools", "tools", critic=True, overrides={
        ("rollout.chat.max_tokens", "rollout.sequence.max_tokens"): 500,
        "ppo.mini_batch_size": 2, "ppo.micro_batch_size": 1}),
    # GiGPO on the default profile (configs/profiles/gigpo.yaml is the GPU run): 2 groups of 2
    # episodes, each group from one seed, so the first observations form an anchor-state group
    Case("c", "gigpo", "default", critic=False, overrides={
        "algo.advantage": "gigpo", "algo.group_size": 2, "rollout.n_envs": 4,
        "env.max_turns": 3, "ppo.mini_batch_size": 6, "ppo.micro_batch_size": 3}),
    Case("d", "vision", "vision", critic=True, vision=True, overrides={
        ("rollout.chat.max_assistant_turns", "rollout.sequence.max_assistant_turns"): 2,
        ("rollout.chat.max_user_turns", "rollout.sequence.max_user_turns"): 2,
        ("rollout.chat.max_tokens", "rollout.sequence.max_tokens"): 1200,
        "ppo.mini_batch_size": 2, "ppo.micro_batch_size": 1}),
)


def pick(letters: str) -> list[Case]:
    """`a,b` → those cases in table order; an unknown letter is one line naming it."""
    wanted = [x.strip() for x in letters.split(",") if x.strip()]
    known = {c.letter: c for c in CASES}
    unknown = [x for x in wanted if x not in known]
    if unknown or not wanted:
        raise ParityError(f"--cases {letters!r}: unknown case {unknown[:1] or ['(none)']}; "
                          f"known: {', '.join(f'{c.letter} ({c.name})' for c in CASES)}")
    return [c for c in CASES if c.letter in wanted]


def overrides(case: Case, model_source: str | None, tiny: bool) -> dict[Key, Any]:
    """Everything a case sets; model.source only when given (None: the profile's own model)."""
    model = {} if model_source is None else {MODEL_SOURCE: model_source}
    return {**COMMON, **(TINY if tiny else {}), **case.overrides, **model}


def set_key(params: dict, key: Key, value: Any, where: str) -> None:
    """Set the first of `key`'s alternative dotted paths that `params` holds (every leaf is in
    a written params file, so a missing one is a rename to put in the table)."""
    for path in (key,) if isinstance(key, str) else key:
        *parents, leaf = path.split(".")
        node = params
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf in node:
            node[leaf] = value
            return
    raise ParityError(f"{where}: no key {key!r} in the params file: add its new name to the "
                      "table in bench/parity/cases.py")


def apply(params: dict, values: dict[Key, Any], where: str) -> dict:
    for key, value in values.items():
        set_key(params, key, value, where)
    return params


def stage_commands(case: Case, params: Path, run: Path) -> list[tuple[str, list[str]]]:
    """(stage, argv after `python`) in order, as dvc.yaml runs them, with outputs under `run`."""
    base, critic = run / "base", run / "critic"
    stages = [("prepare_model", ["components/prepare_model.py", "--params", str(params),
                                 "--out", str(base)])]
    if case.critic:
        stages.append(("critic_warmup", [
            "components/critic_warmup.py", "--params", str(params), "--model-dir", str(base),
            "--out", str(critic), "--live", str(run / "critic_live"),
            "--work", str(run / "critic_batches"), "--metrics", str(run / "critic_metrics.json")]))
    stages.append(("train", ["components/train.py", "--params", str(params),
                             "--model-dir", str(base), "--critic-dir", str(critic),
                             "--out", str(run / "train")]))
    return stages
