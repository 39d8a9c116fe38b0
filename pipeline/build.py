"""The Kubeflow pipeline, built from params: the DVC stage list with train unrolled into segments.

A v2 pipeline cannot loop, so `train.iterations` becomes ceil(iterations / iterations_per_task)
train tasks at compile time, each resuming from the previous one's checkpoints (passed as an
artifact). The params are compiled in as a constant, so a run is reproducible from its YAML.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from kfp import dsl

from longturn.config import Params
from pipeline.components import make_components

GPU = "nvidia.com/gpu"


@dataclass(frozen=True)
class Resources:
    """What the tasks ask of the cluster; 0 GPUs means CPU-only pods."""

    image: str = "longturn:gpu"
    train_gpus: int = 8       # one rank per GPU (params: train.launcher)
    eval_gpus: int = 1        # validation, evaluations and critic warm-up (one process each)
    retries: int = 2          # train segments resume from their last checkpoint
    caching: bool = True


def segment_ends(iterations: int, per_task: int) -> list[int]:
    """The iteration each train task stops before: [per_task, 2 × per_task, ..., iterations]."""
    count = math.ceil(iterations / per_task)
    return [min((i + 1) * per_task, iterations) for i in range(count)]


def _placed(task: dsl.PipelineTask, name: str, gpus: int, caching: bool) -> dsl.PipelineTask:
    """Display name, GPU request (none for 0) and caching of one task."""
    task.set_display_name(name).set_caching_options(caching)
    if gpus > 0:
        task.set_accelerator_type(GPU).set_accelerator_limit(gpus)
    return task


def build_pipeline(params: Params, params_yaml: str, resources: Resources = Resources()) -> Callable:
    """The @dsl.pipeline function for these params (call it under kfp.local, or compile it)."""
    c = make_components(resources.image)
    ends = segment_ends(params.train.iterations, params.train.iterations_per_task)

    r = resources

    @dsl.pipeline(name="longturn", description="Multi-turn PPO: validate, zero-shot eval, critic "
                  "warm-up, train segments, final eval, report")
    def longturn_pipeline():
        base = _placed(c.prepare_model(params_yaml=params_yaml), "prepare_model", 0, r.caching)
        model = base.outputs["base_model"]
        checked = _placed(c.validate_prompts(params_yaml=params_yaml, base_model=model),
                          "validate_prompts", r.eval_gpus, r.caching)
        zero_shot = _placed(c.evaluate(params_yaml=params_yaml, model=model, policy_version="base"),
                            "zero_shot_eval", r.eval_gpus, r.caching).after(checked)
        warm = _placed(c.critic_warmup(params_yaml=params_yaml, base_model=model),
                       "critic_warmup", r.eval_gpus, r.caching).after(checked)
        state = None
        for end in ends:
            common = dict(params_yaml=params_yaml, end_iteration=end, base_model=model,
                          warmup=warm.outputs["warmup"])
            task = (c.train_first_segment(**common) if state is None else
                    c.train_next_segment(previous=state.outputs["state"], **common))
            state = _placed(task, f"train to iteration {end}", r.train_gpus, r.caching)
            state.set_retry(num_retries=r.retries)
        actor = _placed(c.final_actor(state=state.outputs["state"]), "final_actor", 0, r.caching)
        final = _placed(c.evaluate(params_yaml=params_yaml, model=actor.outputs["actor"],
                                   policy_version="final"), "final_eval", r.eval_gpus, r.caching)
        _placed(c.report(params_yaml=params_yaml, zero_shot=zero_shot.outputs["evaluation"],
                         final=final.outputs["evaluation"], state=state.outputs["state"],
                         warmup=warm.outputs["warmup"]), "report", 0, r.caching)

    return longturn_pipeline
