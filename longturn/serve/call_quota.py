"""How many more calls of an episode the endpoint answers now; the next one is held, unanswered.

Why: fixed-turn collection (serve/agent_turns.py) takes exactly `rollout.turns_per_env` calls of
each slot per iteration. The call after an episode's quota is the one that would have come next:
it is held (its prompt is the bootstrap the critic values) and answered, by the updated policy,
when the next iteration gives the episode a new quota. An episode without a quota is answered at
once (whole-episode rollouts). Lives on the server's event loop: no lock.
"""

from __future__ import annotations

import asyncio

from longturn.serve.openai_request import RequestError


class CallQuota:
    """Per episode: the calls it may still make now, and the calls waiting beyond that."""

    def __init__(self) -> None:
        self._left: dict[str, int] = {}
        self._held: dict[str, list[tuple[list[int], asyncio.Future]]] = {}

    async def admit(self, episode: str, prompt_ids: list[int]) -> None:
        """Return when the call may go to the engine (at once without a quota)."""
        left = self._left.get(episode)
        if left is None:
            return
        if left > 0:
            self._left[episode] = left - 1
            return
        future = asyncio.get_running_loop().create_future()
        self._held.setdefault(episode, []).append((list(prompt_ids), future))
        await future  # set by `allow` (counted there) or failed by `drop`

    def allow(self, quotas: dict[str, int]) -> None:
        """Give each episode so many more calls; held calls go first, in arrival order."""
        for episode, calls in quotas.items():
            held = [h for h in self._held.pop(episode, []) if not h[1].done()]  # a client gone
            while calls and held:
                calls -= 1
                held.pop(0)[1].set_result(None)
            self._left[episode] = calls
            if held:
                self._held[episode] = held

    def state(self) -> dict[str, tuple[int, list[int] | None]]:
        """Episode → (calls it may still make, the prompt ids of its first held call or None)."""
        first = {e: next((ids for ids, f in held if not f.done()), None)
                 for e, held in self._held.items()}
        return {e: (left, first.get(e)) for e, left in self._left.items()}

    def spent(self) -> int:
        """Episodes with no call left: the batcher does not wait for them."""
        return sum(left == 0 for left in self._left.values())

    def drop(self, episode: str, err: RequestError) -> None:
        """Forget the episode's quota; its held calls are answered `err`."""
        self._left.pop(episode, None)
        for _, future in self._held.pop(episode, []):
            if not future.done():
                future.set_exception(err)

    def drop_all(self, err: RequestError) -> None:
        for episode in list(self._left):
            self.drop(episode, err)
