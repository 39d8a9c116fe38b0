"""An env's episodes played as the train rollout plays them (conversations of the env, each reply
given the action prompt: `ConversationRun.of_env`), for tests that read what each reply was
given."""

from __future__ import annotations

from typing import Callable

from longturn.engines.base import Completion
from longturn.params.config import Params
from longturn.rollout.conversation_player import conversation_fixed_turns
from longturn.rollout.conversation_setup import ConversationRun
from settings_from_params import sampling_settings


class Scripted:
    """Answers the k-th prompt (counted from 0 over the calls) with `reply(k)`."""

    def __init__(self, tokenizer, reply: Callable[[int], str]):
        self.tokenizer, self.reply, self.count = tokenizer, reply, 0

    def generate(self, prompt_ids, sampling, images=None):
        out = []
        for _ in prompt_ids:
            ids = self.tokenizer(self.reply(self.count), add_special_tokens=False)["input_ids"]
            out.append(Completion(ids, [0.0] * len(ids), "stop"))
            self.count += 1
        return out


def one_slot_batch(params: Params, tokenizer, reply: Callable[[int], str], steps: int) -> list:
    """One fixed-turn batch of `steps` lock-steps in one slot on the first of env.tasks: its
    samples, a reply each (the last one bootstrapped from the prompt a next reply would get)."""
    collector = conversation_fixed_turns(ConversationRun.of_env(params, progress=False),
                                         list(params.env.tasks)[:1], 1, steps, params.seed,
                                         run_id="t")
    try:
        return collector.collect(Scripted(tokenizer, reply), tokenizer, sampling_settings(), 0,
                                 progress=False)
    finally:
        collector.close()
