"""The Kubeflow pipeline, built from params: the DVC stage list with train unrolled into segments.

A v2 pipeline cannot loop, so `train.iterations` becomes ceil(iterations / iterations_per_task)
train tasks at compile time. Each takes the previous one's checkpoint as a `Model` artifact and
writes its own checkpoint and its own iterations' trajectories (`Dataset`); the last also writes
the final actor and the metrics (pipeline/segments.py). The params are compiled in as a constant
(less `kubeflow:`, pipeline/params_text.py), so a run is reproducible from its YAML and Kubeflow
caches each task on the params and its input artifacts.
"""

from __future__ import annotations

import math
from typing import Callable

from kfp import dsl

from longturn.params.config import Params
from pipeline.cluster import Cluster, place, secrets_as_env
from pipeline.components import make_components
from pipeline.params_text import without_section
from pipeline.segments import WORK_DIR_ENV


def segment_ends(iterations: int, per_task: int) -> list[int]:
    """The iteration each train task stops before: [per_task, 2 × per_task, ..., iterations]."""
    count = math.ceil(iterations / per_task)
    return [min((i + 1) * per_task, iterations) for i in range(count)]


def build_pipeline(params: Params, params_file_text: str, cluster: Cluster = Cluster()) -> Callable:
    """The @dsl.pipeline function for these params (call it under kfp.local, or compile it)."""
    c = make_components(cluster.image)
    ends = segment_ends(params.train.iterations, params.train.iterations_per_task)
    params_yaml = without_section(params_file_text)
    kubeflow = cluster.kubeflow

    @dsl.pipeline(name="longturn", description="Multi-turn PPO: validate, zero-shot eval, critic "
                  "warm-up, train segments, final eval, report")
    def longturn_pipeline():
        source = None
        if kubeflow.model_uri is not None:
            source = dsl.importer(artifact_uri=kubeflow.model_uri, artifact_class=dsl.Model,
                                  reimport=False).set_display_name("import model").output
        prepare = (c.prepare_model(params_yaml=params_yaml, source=source) if source is not None
                   else c.prepare_model(params_yaml=params_yaml))
        base = place(prepare, "prepare_model", "prepare_model", cluster, volume=source is None)
        model = base.outputs["base_model"]
        checked = place(c.validate_prompts(params_yaml=params_yaml, base_model=model),
                        "validate_prompts", "validate_prompts", cluster)
        zero_shot = place(c.evaluate(params_yaml=params_yaml, model=model, policy_version="base"),
                          "zero_shot_eval", "eval", cluster).after(checked)
        warm = place(c.critic_warmup(params_yaml=params_yaml, base_model=model),
                     "critic_warmup", "critic_warmup", cluster).after(checked)
        segment = None
        for end in ends:
            inputs = dict(params_yaml=params_yaml, end_iteration=end, base_model=model,
                          warmup=warm.outputs["warmup"])
            if segment is not None:
                inputs["previous"] = segment.outputs["checkpoint"]
            task = (c.train_last_segment if end == ends[-1] else c.train_segment)(**inputs)
            segment = place(task, f"train to iteration {end}", "train", cluster,
                            volume=kubeflow.work_dir is not None)
            segment.set_retry(num_retries=cluster.retries)
            if not cluster.local:
                if kubeflow.work_dir is not None:
                    segment.set_env_variable(WORK_DIR_ENV, kubeflow.work_dir)
                secrets_as_env(segment, kubeflow.secret_env)
        final = place(c.evaluate(params_yaml=params_yaml, model=segment.outputs["actor"],
                                 policy_version="final"), "final_eval", "eval", cluster)
        place(c.report(params_yaml=params_yaml, zero_shot=zero_shot.outputs["evaluation"],
                       final=final.outputs["evaluation"], train_live=segment.outputs["live"],
                       warmup=warm.outputs["warmup"]), "report", "report", cluster)

    return longturn_pipeline
