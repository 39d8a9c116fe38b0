"""Critic-free turn-level advantages: GRPO's episode-group baseline and GiGPO's anchor states.

Both compare the episodes of a group (`algo.group_size` of them, started from one env seed), so
no critic is needed; each token of a turn gets the turn's advantage. The formulas are in
docs/design.md §5b (GRPO: Shao et al. 2024; GiGPO: Feng et al. 2025, arXiv:2505.10978).

A turn's reward is everything the turn earned, −β·KL of its tokens included (as with GAE). An
episode with an aborted turn has no return to compare: its turns get 0 and it joins no group. A
truncated episode's return is what it collected (nothing is bootstrapped without a critic).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from longturn.params.estimator import Estimator

STD_EPS = 1e-6  # keeps Â finite for a group of equal returns; a numerical guard, not a setting


@dataclass(frozen=True)
class GroupParams:
    """What a critic-free estimator needs, without defaults of its own: the trainer passes its
    settings, `from_algo` reads the algo section a file's metadata recorded."""

    estimator: str
    gamma_step: float
    norm_std: bool
    step_weight: float

    def __post_init__(self) -> None:
        if Estimator.named(self.estimator).has_critic:
            raise ValueError(f"{self.estimator!r} has a critic: group advantages are for a "
                             "critic-free estimator")

    @classmethod
    def from_algo(cls, algo: Mapping[str, Any], gamma_step: float) -> GroupParams:
        """From the algo section as a mapping (`params.algo.model_dump()`, which Parquet metadata
        records) and gae.gamma_step."""
        missing = [k for k in ("advantage", "norm_std", "step_weight") if k not in algo]
        if missing:
            raise ValueError(f"the algo section {dict(algo)} lacks {missing}: it was not "
                             "written by longturn's params (params.algo.model_dump())")
        return cls(estimator=algo["advantage"], gamma_step=float(gamma_step),
                   norm_std=bool(algo["norm_std"]), step_weight=float(algo["step_weight"]))


def normalised(values: np.ndarray, norm_std: bool) -> np.ndarray:
    """values − mean, over (population std + STD_EPS) when `norm_std`; 0 for fewer than two."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2:
        return np.zeros(len(values))
    centered = values - values.mean()
    return centered / (values.std() + STD_EPS) if norm_std else centered


def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """G_t = Σ_k γ^(k−t) r_k over one episode's turns."""
    out = np.zeros(len(rewards))
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def turn_advantages(group: Sequence[Any], episode: Sequence[Any], turn: Sequence[int],
                    reward: Sequence[float], observation: Sequence[str],
                    aborted: Sequence[bool], params: GroupParams) -> tuple[np.ndarray, np.ndarray]:
    """(advantage, discounted return G_t) per turn row; rows may come in any order."""
    n = len(turn)
    if not all(len(c) == n for c in (group, episode, reward, observation, aborted)):
        raise ValueError("turn_advantages: every column needs one value per row")
    advantages, returns = np.zeros(n), np.zeros(n)
    rows_of: dict[Any, list[int]] = defaultdict(list)
    for i, e in enumerate(episode):
        rows_of[e].append(i)
    episodes_of: dict[Any, list[Any]] = defaultdict(list)
    for e, rows in rows_of.items():
        rows.sort(key=lambda i: turn[i])
        if any(aborted[i] for i in rows):
            continue
        groups = {group[i] for i in rows}
        if len(groups) != 1:
            raise ValueError(f"episode {e!r} has turns in several groups: {sorted(map(str, groups))}")
        returns[rows] = discounted_returns(np.asarray([reward[i] for i in rows], float),
                                           params.gamma_step)
        episodes_of[groups.pop()].append(e)
    for episodes in episodes_of.values():
        totals = np.asarray([sum(reward[i] for i in rows_of[e]) for e in episodes], float)
        for e, a in zip(episodes, normalised(totals, params.norm_std)):
            rows = rows_of[e]
            advantages[rows] = a * params.gamma_step ** np.arange(len(rows) - 1, -1, -1)
    if params.estimator == "gigpo":
        anchors: dict[tuple[Any, str], list[int]] = defaultdict(list)
        for g, episodes in episodes_of.items():
            for e in episodes:
                for i in rows_of[e]:
                    anchors[(g, observation[i])].append(i)
        for rows in anchors.values():
            advantages[rows] += params.step_weight * normalised(returns[rows], params.norm_std)
    return advantages, returns
