"""Compile, run locally, or submit the Kubeflow pipeline.

    python -m pipeline compile --params params.yaml --image IMG  # after make params PROFILE=gpu   # YAML to upload
    python -m pipeline local --params params.yaml --root /tmp/kfp      # every task here, no cluster
    python -m pipeline submit --params params.yaml --image IMG --host https://kfp.example \\
        --namespace team-a --token "$TOKEN" --experiment longturn

Cluster settings (volume, model URI, requests, node selector, tolerations) come from `kubeflow:`
in the params file; the flags below override them for one compile or submission.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from longturn.params.config import ParamsError, load_params
from pipeline.build import build_pipeline
from pipeline.cluster import Cluster, check_model_source, with_overrides
from pipeline.submit import Submission, SubmitError, submit

ROOT = Path(__file__).resolve().parents[1]


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pipeline", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[1:]))
    p.add_argument("action", choices=["compile", "local", "submit"])
    p.add_argument("--params", default="params.yaml", help="compiled into the pipeline")
    p.add_argument("--image", default=Cluster.image, help="the image built from Dockerfile")
    p.add_argument("--out", default="longturn-pipeline.yaml", help="the compiled pipeline YAML")
    p.add_argument("--retries", type=int, default=Cluster.retries, help="per train segment")
    p.add_argument("--no-cache", action="store_true", help="rerun every task")
    k = p.add_argument_group("cluster (override kubeflow: in the params file)")
    k.add_argument("--gpus", type=int, help="GPUs per train task (kubeflow.resources.train.gpus)")
    k.add_argument("--eval-gpus", type=int, help="GPUs for validation, evaluation and warm-up")
    k.add_argument("--pvc", help="PersistentVolumeClaim to mount (kubeflow.pvc)")
    k.add_argument("--mount-path", help="where the claim is mounted (kubeflow.mount_path)")
    k.add_argument("--model-uri", help="object-store HF dir for prepare_model (kubeflow.model_uri)")
    k.add_argument("--work-dir", help="train scratch on the volume (kubeflow.work_dir)")
    s = p.add_argument_group("submit")
    s.add_argument("--host", help="the Kubeflow Pipelines API endpoint")
    s.add_argument("--namespace", help="the Kubeflow profile namespace (multi-user installs)")
    auth = s.add_mutually_exclusive_group()
    auth.add_argument("--token", help="an existing bearer token for the endpoint")
    auth.add_argument("--in-cluster", action="store_true",
                      help="use this pod's projected Kubeflow service-account token")
    s.add_argument("--experiment", default="longturn", help="experiment name")
    s.add_argument("--run-name", help="default: longturn-<git commit>-<UTC time>")
    p.add_argument("--root", default="kfp_local", help="local: where task outputs go")
    return p.parse_args(argv)


def _cluster(args: argparse.Namespace, params) -> Cluster:
    kubeflow = with_overrides(params.kubeflow, {
        "gpus": args.gpus, "eval_gpus": args.eval_gpus, "pvc": args.pvc,
        "mount_path": args.mount_path, "model_uri": args.model_uri, "work_dir": args.work_dir})
    local = args.action == "local"
    warning = check_model_source(params, kubeflow, local)
    if warning:
        print(f"pipeline: warning: {warning}", file=sys.stderr)
    return Cluster(image=args.image, kubeflow=kubeflow, local=local, retries=args.retries,
                   caching=not args.no_cache)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    try:
        params = load_params(args.params)
        cluster = _cluster(args, params)
    except ParamsError as err:
        print(f"pipeline: error: {err}", file=sys.stderr)
        return 2
    pipeline_func = build_pipeline(params, Path(args.params).read_text(), cluster)
    if cluster.local:
        return _run_local(pipeline_func, args.root)
    from kfp import compiler

    compiler.Compiler().compile(pipeline_func, package_path=args.out)
    print(f"compiled {args.out}")
    if args.action != "submit":
        return 0
    submission = Submission(host=args.host, namespace=args.namespace, token=args.token,
                            in_cluster=args.in_cluster, experiment=args.experiment,
                            run_name=args.run_name, caching=not args.no_cache)
    try:
        run_id, run_name = submit(args.out, submission, ROOT)
    except SubmitError as err:
        print(f"pipeline: error: {err}", file=sys.stderr)
        return 2
    print(f"submitted run {run_name} ({run_id}) to {args.host or 'the in-cluster endpoint'}")
    return 0


def _run_local(pipeline_func, root: str) -> int:
    """Every task as a subprocess of this interpreter (kfp.local), outputs under `root`."""
    import warnings

    from kfp import local

    warnings.filterwarnings("ignore", message=".*have no effect in the current local runner")
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=root)
    pipeline_func()
    print(f"local run finished; task outputs under {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
