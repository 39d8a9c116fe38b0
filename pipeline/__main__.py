"""Compile, run locally, or submit the Kubeflow pipeline.

    python -m pipeline compile --params params-gpu.yaml [--image IMG] [--gpus 8]  # YAML to upload
    python -m pipeline local --params params.yaml --root /tmp/kfp   # every task here, no cluster
    python -m pipeline submit --params params-gpu.yaml --host http://kfp.example:8080 [--image IMG]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from longturn.config import ParamsError, load_params
from pipeline.build import Resources, build_pipeline


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pipeline", description=__doc__.splitlines()[0])
    p.add_argument("action", choices=["compile", "local", "submit"])
    p.add_argument("--params", default="params.yaml", help="compiled into the pipeline")
    p.add_argument("--image", default=Resources.image, help="the image built from Dockerfile")
    p.add_argument("--gpus", type=int, default=Resources.train_gpus, help="GPUs per train task")
    p.add_argument("--eval-gpus", type=int, default=Resources.eval_gpus,
                   help="GPUs for validation, evaluation and warm-up tasks")
    p.add_argument("--retries", type=int, default=Resources.retries)
    p.add_argument("--no-cache", action="store_true", help="rerun every task")
    p.add_argument("--out", default="longturn-pipeline.yaml", help="the compiled pipeline YAML")
    p.add_argument("--root", default="kfp_local", help="local: where task outputs go")
    p.add_argument("--host", help="submit: the Kubeflow Pipelines API endpoint")
    p.add_argument("--experiment", default="longturn", help="submit: experiment name")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    try:
        params = load_params(args.params)
    except ParamsError as err:
        print(f"pipeline: error: {err}", file=sys.stderr)
        return 2
    local = args.action == "local"
    resources = Resources(image=args.image, train_gpus=0 if local else args.gpus,
                          eval_gpus=0 if local else args.eval_gpus, retries=args.retries,
                          caching=not args.no_cache)
    pipeline_func = build_pipeline(params, Path(args.params).read_text(), resources)
    if local:
        return _run_local(pipeline_func, args.root)
    from kfp import compiler

    package = args.out
    compiler.Compiler().compile(pipeline_func, package_path=package)
    print(f"compiled {package}")
    return _submit(package, args) if args.action == "submit" else 0


def _run_local(pipeline_func, root: str) -> int:
    """Every task as a subprocess of this interpreter (kfp.local), outputs under `root`."""
    import warnings

    from kfp import local

    warnings.filterwarnings("ignore", message=".*have no effect in the current local runner")
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=root)
    pipeline_func()
    print(f"local run finished; task outputs under {root}")
    return 0


def _submit(package: str, args: argparse.Namespace) -> int:
    if not args.host:
        print("pipeline: error: submit needs --host (the Kubeflow Pipelines endpoint)", file=sys.stderr)
        return 2
    import kfp

    try:
        client = kfp.Client(host=args.host)
        run = client.create_run_from_pipeline_package(package, experiment_name=args.experiment,
                                                      enable_caching=not args.no_cache)
    except Exception as err:  # kfp raises bare connection errors from its constructor
        print(f"pipeline: error: could not submit to {args.host}: {err}", file=sys.stderr)
        return 2
    print(f"submitted run {run.run_id} to {args.host}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
