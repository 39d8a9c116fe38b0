"""The advantage estimator `algo.advantage` names, as one value: whether a critic exists and how
the rollout collects the batches it learns from.

Why one value: the critic warm-up, the trainer, the collector, the critic dir the train stage
checks and the report all hinge on the same two facts. Read from one table, they cannot disagree
(a stage loading a critic the collector never bootstraps from, or a report drawing value curves
of a run that had none).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from longturn.errors import SettingError


class Collection(enum.Enum):
    """How an estimator's batches are collected."""

    FIXED_TURNS = "fixed_turns"
    """Every iteration steps each env slot a fixed number of turns, and an unfinished episode
    continues in the next iteration. Possible only with a critic: the last turn of a cut episode
    is bootstrapped with V(next observation). Every update sees the same number of turns however
    long episodes are (rollout/collection.py `FixedTurnBatches`, with either protocol's slots)."""

    SEED_GROUPS = "seed_groups"
    """Every iteration plays groups of `algo.group_size` episodes from one env seed to their end.
    Without a critic nothing can value a cut episode, so the advantage compares whole episodes
    that differ only by sampling (rollout/collection.py `EpisodeGroups`)."""


@dataclass(frozen=True)
class Estimator:
    """One advantage estimator: its `algo.advantage` name, whether it learns a value model, and
    the collection its advantages need."""

    name: str
    has_critic: bool
    collection: Collection

    @classmethod
    def named(cls, name: str) -> Estimator:
        """The estimator `algo.advantage` names; an unknown name is a setting error."""
        try:
            return ESTIMATORS[name]
        except (KeyError, TypeError):
            raise SettingError(f"algo.advantage {name!r} is not an estimator: one of "
                               f"{', '.join(ESTIMATORS)}") from None


# the known estimators; params/config.py's `algo.advantage` choices are held equal to these keys
# by tests/test_estimator.py (params sits below algo and cannot import this table)
ESTIMATORS: dict[str, Estimator] = {e.name: e for e in (
    Estimator("gae", has_critic=True, collection=Collection.FIXED_TURNS),
    Estimator("grpo", has_critic=False, collection=Collection.SEED_GROUPS),
    Estimator("gigpo", has_critic=False, collection=Collection.SEED_GROUPS),
)}
