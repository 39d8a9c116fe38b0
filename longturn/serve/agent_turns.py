"""Fixed-turn collection for `rollout.agent` under a critic (`algo.advantage: gae`): each
iteration takes exactly `rollout.turns_per_env` calls of each of `rollout.n_envs` agent slots,
and episodes go on across iterations, as Verlog's fixed-turn batches do for an env's episodes
(rollout/collection.py; docs/openai-endpoint.md, "Fixed-turn batches (GAE)").

Why: played whole, a long agent episode makes an update wait for its slowest episode and sizes
each batch by episode lengths. Here an agent runs in its thread across iterations against one
endpoint that stays up (the engine object persists; its weights are pushed between iterations).
Once an episode has made its quota of calls this iteration, its next call is held unanswered by
the endpoint (serve/call_quota.py): its prompt is the bootstrap of the episode's last answered
call (the record is `cut`), and it is answered, by the updated policy, as the slot's first call
of the next iteration. An episode that ends starts the slot's next one (a new task) at once.
"""

from __future__ import annotations

import json
import logging
import pickle
import threading
import time
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Any

from longturn.engines.base import Engine, SamplingParams
from longturn.params.config import Params
from longturn.rollout.conversation import AGENT_TIMEOUT
from longturn.rollout.conversation_setup import ConversationRun
from longturn.rollout.collection import next_start, restored_counters, saved_state, slot_index
from longturn.rollout.samples import samples_from_episodes
from longturn.serve.agent_rollout import Agent, _outcome, _record, quiet_http_clients
from longturn.serve.episode_reward import Outcome
from longturn.serve.server import OpenAIServer
from longturn.tasks.plugins import import_class

log = logging.getLogger(__name__)

POLL_S = 0.02  # how often the slots are looked at while agents play


@dataclass
class _Slot:
    """The episode a slot plays now."""

    task: dict[str, Any]
    name: str  # its id on the endpoint (in its base URL)
    episode_id: str  # its id in the files
    future: Future
    taken: int = 0  # its calls already in earlier iterations' records
    spent_s: float = 0.0  # time it ran, not held, before this iteration's clock started


class AgentTurnCollector:
    """n_envs agent slots × turns_per_env calls per iteration, episodes carried over."""

    def __init__(self, run: ConversationRun, agent: Agent, timeout_s: float, tasks: list[str],
                 n_envs: int, turns_per_env: int, seed: int, rank: int = 0,
                 run_id: str = "train"):
        self.run, self.agent, self.timeout_s, self.tasks = run, agent, timeout_s, tasks
        self.n_envs, self.turns_per_env = n_envs, turns_per_env
        self.seed, self.rank, self.run_id = seed, rank, run_id
        self.episode_counts = [0] * n_envs
        self.slots: list[_Slot | None] = [None] * n_envs
        self.server: OpenAIServer | None = None

    @classmethod
    def from_params(cls, params: Params, run: ConversationRun, rank: int, run_id: str
                    ) -> "AgentTurnCollector":
        r = params.rollout
        return cls(run, import_class(r.agent, f"rollout.agent {r.agent!r}"),
                   r.agent_timeout_s, list(params.env.tasks), r.n_envs, r.turns_per_env,
                   params.seed, rank=rank, run_id=run_id)

    def _serve(self, engine: Engine, tokenizer: Any, sampling: SamplingParams) -> OpenAIServer:
        """The endpoint, started on the first iteration's engine and kept up."""
        if self.server is None:
            quiet_http_clients()
            room = max(1, self.run.settings.max_tokens - sampling.max_new_tokens)
            self.server = OpenAIServer(engine, tokenizer, sampling,
                                       max_prompt_tokens=room).start()
        elif self.server.engine is not engine:
            raise ValueError("the agent slots serve the engine of their first iteration; its "
                             "weights change in place, the engine object stays")
        return self.server

    def _start(self, i: int, quota: int) -> None:
        """The slot's next episode: opened with its quota before its agent can call."""
        start = next_start(self.episode_counts, i, self.tasks, self.seed, self.rank, self.run_id)
        task = self.run.record(start.task, start.seed)
        name = f"slot{i}-{self.episode_counts[i] - 1}"
        assert self.server is not None
        url = self.server.open_episode(name)
        self.server.allow({name: quota})
        self.slots[i] = _Slot(task, name, start.episode_id, self._play(task, url, name))

    def _play(self, task: dict[str, Any], url: str, name: str) -> Future:
        """The agent in a daemon thread of its own (a hung one is left behind, and must not
        take a pool's worker from the next episode nor keep the stage from exiting)."""
        future: Future = Future()

        def play() -> None:
            try:
                future.set_result(self.agent(dict(task), url))
            except BaseException as err:  # the agent's own failure: its episode's outcome
                future.set_exception(err)
        threading.Thread(target=play, daemon=True, name=f"agent-{name}").start()
        return future

    def collect(self, engine: Engine, tokenizer: Any, sampling: SamplingParams, iteration: int,
                extra: dict[str, Any], progress: bool = True) -> list[dict[str, Any]]:
        """turns_per_env calls of every slot, as samples (one per call: its window)."""
        return samples_from_episodes(self.records(engine, tokenizer, sampling, iteration, extra))

    def records(self, engine: Engine, tokenizer: Any, sampling: SamplingParams, iteration: int,
                extra: dict[str, Any]) -> list[dict[str, Any]]:
        """turns_per_env calls of every slot: one record per episode portion, by slot and step."""
        server = self._serve(engine, tokenizer, sampling)
        made = [0] * self.n_envs  # calls of each slot this iteration
        for i, slot in enumerate(self.slots):
            if slot is None:
                self._start(i, self.turns_per_env)
        server.allow({s.name: self.turns_per_env for s in self.slots if s is not None})
        clock = [time.monotonic()] * self.n_envs
        records: list[dict[str, Any]] = []
        todo = set(range(self.n_envs))
        while todo:
            wait([self.slots[i].future for i in todo], timeout=POLL_S,  # type: ignore[union-attr]
                 return_when="FIRST_COMPLETED")
            quotas, now = server.quotas(), time.monotonic()
            for i in sorted(todo):
                slot = self.slots[i]
                assert slot is not None
                left, held = quotas[slot.name]
                ran = slot.spent_s + now - clock[i]
                if not slot.future.done() and left == 0 and held is not None:
                    calls = server.calls(slot.name)  # its quota made; its next call waits
                    if len(calls) > slot.taken:
                        records.append(self._portion(i, slot, calls, (None, None), made[i],
                                                     held))
                    slot.taken, slot.spent_s = len(calls), ran
                    todo.discard(i)
                elif slot.future.done() or ran > self.timeout_s:
                    if slot.future.done():
                        outcome = _outcome(slot.future, slot.episode_id)
                    else:
                        log.warning("agent of episode %s ran %g s (time held not counted): "
                                    "episode aborted", slot.episode_id, self.timeout_s)
                        outcome = None, AGENT_TIMEOUT
                    calls = server.close_episode(slot.name)
                    records.append(self._portion(i, slot, calls, outcome, made[i], None))
                    made[i] += max(len(calls) - slot.taken, int(not calls))  # no call: a step
                    self._start(i, max(0, self.turns_per_env - made[i]))
                    clock[i] = now
                    if made[i] >= self.turns_per_env:
                        todo.discard(i)
        for record in records:
            record.update(extra, iteration=iteration, group_id=None)
        return sorted(records, key=lambda r: (r["env_index"], r["reply_steps"][:1]))

    def _portion(self, i: int, slot: _Slot, calls: list, outcome: Outcome, step: int,
                 bootstrap: list[int] | None) -> dict[str, Any]:
        """The record of the slot's episode this iteration (agent_rollout's, with its slot)."""
        assert self.server is not None
        record = _record(slot.task, calls, outcome, self.run.settings.reward_fn,
                         self.server.renderer, first=slot.taken, step=step, bootstrap=bootstrap)
        ended = bootstrap is None and not record["aborted"]
        record.update(episode_id=slot.episode_id, task=slot.task["task"],
                      episode_seed=int(slot.task["seed"]),
                      env_index=slot_index(self.rank, self.n_envs, i),
                      success=ended and self.run.success(slot.task,
                                                         json.loads(record["messages"])))
        return record

    def action_names(self) -> list[str]:
        return []

    def state(self) -> bytes:
        """The episode counts only (new episodes take new seeds and ids): a running agent cannot
        be saved, so a resumed run starts fresh episodes in every slot."""
        return pickle.dumps({"episode_counts": self.episode_counts})

    def load_state(self, blob: bytes) -> None:
        self.episode_counts = restored_counters(saved_state(blob), self.episode_counts)

    def close(self) -> None:
        """Stop the endpoint (held and running calls are refused, so agents return) and leave
        the agent threads behind (Python cannot stop a thread)."""
        if self.server is not None:
            self.server.stop()
            self.server = None
        self.slots = [None] * self.n_envs
