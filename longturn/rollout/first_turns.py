"""Prompt validation's first replies: each seed's first prompt (`agent/prompts.py`) sampled once
and read as an action, the env never stepped, handed on as samples of the one schema with no
reward and nothing ended, so what reads them (the gate's metrics, the samples file) reads what
training writes."""

from __future__ import annotations

from typing import Any

from longturn.agent.prompts import Prompt
from longturn.engines.base import Engine, SamplingParams, generate_with_frames
from longturn.envs.base import TextEnv
from longturn.envs.registry import translator_for
from longturn.rollout.samples import sample_from_turn
from longturn.vision.frames import to_png


def first_turn_samples(engine: Engine, tokenizer: Any, env: TextEnv, prompts: list[Prompt],
                       seeds: list[int], sampling: SamplingParams) -> list[dict[str, Any]]:
    """One reply to each prompt (seed i's first observation), in one generation; each read as
    the action parser reads a reply (its text without special tokens)."""
    completions = generate_with_frames(
        engine, [p.ids for p in prompts],
        [list(zip(p.image_starts, p.frames)) for p in prompts], sampling)
    translator = translator_for(env)
    out = []
    for seed, prompt, completion in zip(seeds, prompts, completions):
        text = tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        parsed = translator.parse(text)
        frames = ({"images": [to_png(frame) for frame in prompt.frames],
                   "image_starts": list(prompt.image_starts)} if prompt.frames else {})
        out.append(sample_from_turn({
            "env_name": env.name, "task": env.task, "episode_id": f"validation-{env.task}-{seed}",
            "episode_seed": seed, "turn": 0, "step": 0, **frames, "prompt_ids": prompt.ids,
            "response_ids": completion.token_ids, "prompt_text": prompt.text,
            "response_text": text, "raw_action": parsed.raw_action, "action": parsed.action,
            "action_valid": parsed.valid, "action_failure": parsed.failure,
            "finish_reason": completion.finish_reason, "history_dropped": prompt.history_dropped,
            "engine_logprobs": completion.logprobs}))
    return out
