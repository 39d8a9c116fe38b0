"""The Kubeflow components: one lightweight Python component per stage, all on the GPU image.

Bodies only import this project (installed in the image) and call pipeline.stage_calls or
pipeline.segments; they are lightweight components rather than container components so that
`kfp.local` can run the whole pipeline here, with no Docker engine, in this interpreter. (No
`from __future__ import annotations` here: kfp reads the artifact types from the live
annotations.)
"""

from types import SimpleNamespace

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Metrics, Model, Output


def prepare_model(params_yaml: str, base_model: Output[Model], source: Input[Model] = None):
    """`source`: an HF dir imported from an object store (kubeflow.model_uri); without it the
    stage reads model.source (an embedded model, or a path on the mounted volume)."""
    from pipeline.stage_calls import run_stage

    overrides = {"model.source": source.path} if source is not None else None
    run_stage("prepare_model", params_yaml, "--out", base_model.path, overrides=overrides)


def validate_prompts(params_yaml: str, base_model: Input[Model], validation: Output[Artifact]):
    from pipeline.stage_calls import run_stage

    run_stage("validate_prompts", params_yaml, "--model-dir", base_model.path,
              "--out", validation.path)


def evaluate(params_yaml: str, model: Input[Model], policy_version: str,
             evaluation: Output[Artifact], metrics: Output[Metrics]):
    from pipeline.stage_calls import run_stage, success_rate

    run_stage("zero_shot_eval", params_yaml, "--model-dir", model.path, "--out", evaluation.path,
              "--policy-version", policy_version)
    metrics.log_metric("success_rate", success_rate(evaluation.path))


def critic_warmup(params_yaml: str, base_model: Input[Model], warmup: Output[Artifact]):
    from pipeline.stage_calls import warmup as run_warmup

    run_warmup(params_yaml, base_model.path, warmup.path)


def train_segment(params_yaml: str, end_iteration: int, base_model: Input[Model],
                  warmup: Input[Artifact], checkpoint: Output[Model],
                  trajectories: Output[Dataset], previous: Input[Model] = None):
    """Iterations up to `end_iteration` (exclusive), resuming from `previous` (none: the first
    segment); publishes its last checkpoint and its own iterations' trajectories."""
    from pipeline.segments import run_task

    run_task(params_yaml, end_iteration, base_model, warmup, previous, checkpoint, trajectories)


def train_last_segment(params_yaml: str, end_iteration: int, base_model: Input[Model],
                       warmup: Input[Artifact], checkpoint: Output[Model],
                       trajectories: Output[Dataset], actor: Output[Model], live: Output[Artifact],
                       previous: Input[Model] = None):
    """The last segment: also the final actor (an HF dir) and the whole run's DVCLive metrics."""
    from pipeline.segments import run_task

    run_task(params_yaml, end_iteration, base_model, warmup, previous, checkpoint, trajectories,
             actor, live)


def report(params_yaml: str, zero_shot: Input[Artifact], final: Input[Artifact],
           train_live: Input[Artifact], warmup: Input[Artifact], report: Output[Artifact]):
    from pathlib import Path

    from pipeline.stage_calls import run_stage

    run_stage("report", params_yaml, "--zero-shot", zero_shot.path, "--final", final.path,
              "--train-live", train_live.path,
              "--warmup-live", str(Path(warmup.path) / "live"), "--out", report.path)


STAGE_FUNCTIONS = (prepare_model, validate_prompts, evaluate, critic_warmup, train_segment,
                   train_last_segment, report)


def make_components(image: str) -> SimpleNamespace:
    """Every component, built on `image` (the project is installed there, so kfp is not added)."""
    build = dsl.component(base_image=image, install_kfp_package=False)
    return SimpleNamespace(**{f.__name__: build(f) for f in STAGE_FUNCTIONS})
