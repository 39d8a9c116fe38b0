"""Fill the training columns of sequence-mode episodes (docs/design.md §4b, §5c), without grad.

Each episode is scored as one (prompt, response) row (algo/sequence_packing.py): old and reference
logprobs and values on every response token, kept only where the model sampled the token. Token
rewards are −β·KL on sampled tokens plus each reply's reward (tool step rewards, the
interaction's score, the task's reward) on its last token. An episode cut short (turn limits,
token budget) is bootstrapped with the critic's value of its final context, like a time limit.
Advantages are GAE over model tokens with the step discount at each observation gap
(algo/sequence_gae.py), or a critic-free group estimator with each reply as a turn.

`sequence_advantages` computes advantages and returns from a file's own columns, so scoring and
the audit (`audit_sequence_file`) run the same rule and a stored file can be re-checked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
from tqdm.auto import tqdm

from longturn.algo.gae import GAEParams
from longturn.algo.group_advantages import CRITIC_FREE, GroupParams, turn_advantages
from longturn.algo.model_set import ModelSet
from longturn.algo.ppo import kl_penalty
from longturn.algo.scoring import GAE_METADATA_KEYS, ScoringSettings, bootstrap_values, score_batch
from longturn.algo.sequence_gae import sequence_gae
from longturn.algo.sequence_packing import record_images, split_sequence
from longturn.trajectories import read_metadata

Record = dict[str, Any]
ADVANTAGE_INPUTS = ("input_ids", "loss_mask", "segment_starts", "segment_ends", "token_rewards",
                    "values", "bootstrap_value", "truncated", "episode_id", "group_id")


def _full(first: int, context_mask: np.ndarray, part: np.ndarray) -> np.ndarray:
    """A per-response-token array as long as the whole sequence, 0 before `first` and on
    context tokens."""
    return np.concatenate([np.zeros(first, np.float32), part * context_mask]).astype(np.float32)


def sequence_token_rewards(old: np.ndarray, ref: np.ndarray, loss_mask: np.ndarray,
                           segment_ends: list[int], segment_rewards: list[float], beta: float,
                           estimator: str) -> np.ndarray:
    """−β·KL on each sampled token, plus each reply's reward on its last token."""
    kl = kl_penalty(torch.from_numpy(old), torch.from_numpy(ref), estimator).numpy()  # type: ignore[arg-type]
    rewards = -beta * kl * loss_mask
    for end, reward in zip(segment_ends, segment_rewards):
        rewards[end - 1] += reward
    return rewards.astype(np.float32)


def _observations(ids: list[int], starts: list[int], ends: list[int]) -> list[str]:
    """What the model saw just before each reply (the context since the previous one): GiGPO's
    anchor state. Replies of one group after the same context share an anchor."""
    cuts = [0, *ends[:-1]]
    return [" ".join(map(str, ids[c:s])) for c, s in zip(cuts, starts)]


def sequence_advantages(columns: dict[str, list[Any]], gae_params: GAEParams | None,
                        group_params: GroupParams | None
                        ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-token advantages and returns of each episode (as long as `input_ids`, 0 on context):
    GAE when `gae_params`, else the group estimator with each reply as a turn."""
    n = len(columns["input_ids"])
    adv = [np.zeros(len(ids)) for ids in columns["input_ids"]]
    ret = [np.zeros(len(ids)) for ids in columns["input_ids"]]
    scored = [i for i in range(n) if columns["segment_starts"][i]]
    if gae_params is not None:
        for i in scored:
            done = not columns["truncated"][i]
            boot = columns["bootstrap_value"][i]
            a, r = sequence_gae(columns["values"][i], columns["token_rewards"][i],
                                list(columns["segment_starts"][i]),
                                list(columns["segment_ends"][i]), done,
                                0.0 if boot is None else float(boot), gae_params)
            adv[i], ret[i] = a.numpy(), r.numpy()
        return adv, ret
    if group_params is None:
        raise ValueError("sequence_advantages needs GAE or group parameters")
    group, episode, turn, reward, observation, spans = [], [], [], [], [], []
    for i in scored:
        starts, ends = list(columns["segment_starts"][i]), list(columns["segment_ends"][i])
        rewards = np.asarray(columns["token_rewards"][i], dtype=np.float64)
        prev = 0
        for k, (s, e) in enumerate(zip(starts, ends)):
            # a reply's reward: its tokens' KL terms and the reward credited on its last token
            group.append(columns["group_id"][i])
            episode.append(columns["episode_id"][i])
            turn.append(k)
            reward.append(float(rewards[prev:e].sum()))
            spans.append((i, s, e))
            prev = e
        observation += _observations(list(columns["input_ids"][i]), starts, ends)
    a, r = turn_advantages(group, episode, turn, reward, observation, [False] * len(turn),
                           group_params)
    for (i, s, e), ai, ri in zip(spans, a, r):
        adv[i][s:e], ret[i][s:e] = ai, ri
    return adv, ret


def score_sequences(records: list[Record], models: ModelSet, settings: ScoringSettings,
                    gae_params: GAEParams | None, group_params: GroupParams | None,
                    pad_id: int, progress: bool = False) -> list[Record]:
    """Fill old_logprobs, ref_logprobs, values, token_rewards, bootstrap_value, advantages and
    returns (lists as long as `input_ids`) on one rank's episodes, in place. Critic-free
    (`gae_params` None): values and bootstrap_value stay empty. An episode without a reply gets
    zeros: nothing of it is trained."""
    critic = gae_params is not None
    live = [r for r in records if r["segment_starts"]]
    splits = [split_sequence(r) for r in live]
    frames = [record_images(r) for r in live]
    boot_rows = [{"bootstrap_prompt_ids": list(r["input_ids"]), "bootstrap_images": f}
                 if critic and r["truncated"] else {} for r, f in zip(live, frames)]
    bar = tqdm(total=len(live) + sum(map(bool, boot_rows)), desc="score", unit="episode",
               disable=not progress, leave=False)
    with torch.no_grad(), bar:
        scored = score_batch(models, [p for p, _, _ in splits], [r for _, r, _ in splits],
                             settings, pad_id, True, bar, values=critic, images=frames)
        boot = bootstrap_values(models, boot_rows, settings, pad_id, bar) if critic else {}
    for record in records:
        zeros = [0.0] * len(record["input_ids"])
        record.update(old_logprobs=zeros, ref_logprobs=zeros, token_rewards=zeros,
                      values=zeros if critic else None, bootstrap_value=None)
    for j, (record, (prompt, _, mask)) in enumerate(zip(live, splits)):
        m = np.asarray(mask, dtype=np.float32)
        old = _full(len(prompt), m, scored.old[j])
        ref = _full(len(prompt), m, scored.ref[j])
        rewards = sequence_token_rewards(old, ref, np.concatenate([np.zeros(len(prompt)), m]),
                                         list(record["segment_ends"]),
                                         list(record["segment_rewards"]), settings.kl_beta,
                                         settings.kl_estimator)
        record.update(old_logprobs=old.tolist(), ref_logprobs=ref.tolist(),
                      token_rewards=rewards.tolist())
        if critic:
            record["values"] = _full(len(prompt), m, scored.values[j]).tolist()
            record["bootstrap_value"] = float(boot[j]) if j in boot else None
    columns = {k: [r.get(k) for r in records] for k in ADVANTAGE_INPUTS}
    advantages, returns = sequence_advantages(columns, gae_params, group_params)
    for record, a, r in zip(records, advantages, returns):
        record["advantages"] = a.astype(np.float32).tolist()
        record["returns"] = r.astype(np.float32).tolist()
    return records


def audit_sequence_file(parquet_path: str | Path) -> float:
    """Max |stored − recomputed| over advantages and returns of a scored sequence file, with the
    estimator and discounts its metadata records."""
    meta = read_metadata(parquet_path)
    algo = json.loads(meta.get("algo", "{}"))
    names = set(pq.read_schema(str(parquet_path)).names)
    wanted = [c for c in (*ADVANTAGE_INPUTS, "advantages", "returns") if c in names]
    table = pq.read_table(str(parquet_path), columns=wanted).to_pydict()
    for column in ADVANTAGE_INPUTS:
        table.setdefault(column, [None] * len(table["input_ids"]))
    if algo.get("advantage") in CRITIC_FREE:
        gae, group = None, GroupParams.from_algo(algo, meta["gamma_step"])
    else:
        gae, group = GAEParams(*(float(meta[k]) for k in GAE_METADATA_KEYS)), None
    advantages, returns = sequence_advantages(table, gae, group)
    error = 0.0
    for stored, fresh in ((table["advantages"], advantages), (table["returns"], returns)):
        for row, (s, f) in enumerate(zip(stored, fresh)):
            if s is None or len(s) != len(f):
                raise ValueError(f"episode row {row}: stored advantages/returns missing or "
                                 "mis-sized")
            error = max(error, float(np.max(np.abs(np.asarray(s, dtype=np.float64) - f),
                                            initial=0.0)))
    return error
