"""The advantage estimator `algo.advantage` names, and the collection it makes of a rollout: the
two facts every stage hinges on ("is there a critic?", "how are batches collected?").

Read from this one table by `params.algo.estimator` and `params.collection`, the warm-up, the
trainer, the collector, the size and group checks and the report cannot disagree (a stage loading
a critic the collector never bootstraps from, or value curves reported for a run without one).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from longturn.errors import SettingError


class Collection(enum.Enum):
    """How a run's batches are collected (rollout/collection.py), decided by `Params.collection`
    from the estimator and the rollout."""

    FIXED_TURNS = "fixed_turns"
    """Every iteration steps each slot a fixed number of replies, and an unfinished episode
    continues in the next iteration. Possible only with a critic (the last reply of a cut episode
    is bootstrapped with V(what the next reply will be given)) and a rollout that can be cut
    (`RolloutParams.can_be_cut`). Every update sees the same number of replies however
    long episodes are (`FixedTurnBatches`)."""

    SEED_GROUPS = "seed_groups"
    """Every iteration plays groups of `algo.group_size` episodes from one seed to their end.
    Without a critic nothing can value a cut episode, so the advantage compares whole episodes
    that differ only by sampling (`EpisodeGroups` with a group size)."""

    WHOLE_EPISODES = "whole_episodes"
    """A critic, with a rollout that plays each episode whole (the whole episode as context, or a
    rollout function of the user's): n_envs episodes per iteration, no groups (`EpisodeGroups`
    without a group size)."""


@dataclass(frozen=True)
class Estimator:
    """One advantage estimator: its `algo.advantage` name and whether it learns a value model."""

    name: str
    has_critic: bool

    @classmethod
    def named(cls, name: str) -> Estimator:
        """The estimator `algo.advantage` names; an unknown name is a setting error."""
        try:
            return ESTIMATORS[name]
        except (KeyError, TypeError):
            raise SettingError(f"algo.advantage {name!r} is not an estimator: one of "
                               f"{', '.join(ESTIMATORS)}") from None

    def collection(self, rollout_can_be_cut: bool) -> Collection:
        """The collection this estimator makes of a rollout that can (or cannot) be cut into
        fixed-turn batches."""
        if not self.has_critic:
            return Collection.SEED_GROUPS
        return Collection.FIXED_TURNS if rollout_can_be_cut else Collection.WHOLE_EPISODES


# the known estimators; their names are the `algo.advantage` choices params/config.py accepts
ESTIMATORS: dict[str, Estimator] = {e.name: e for e in (
    Estimator("gae", has_critic=True),
    Estimator("grpo", has_critic=False),
    Estimator("gigpo", has_critic=False),
)}
