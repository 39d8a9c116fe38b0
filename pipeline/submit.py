"""Submitting a compiled pipeline to a Kubeflow Pipelines endpoint: auth, namespace, experiment,
and a run name that says which commit the pipeline was compiled from.

Auth is one of: none (a port-forward, or an endpoint that needs none), an existing bearer token
(`--token`, e.g. from `kubectl create token` or your identity provider), or `--in-cluster`: the
service-account token Kubeflow projects into a notebook or pod, read by kfp's
ServiceAccountTokenVolumeCredentials (there `--host` may be left out: kfp then talks to the
in-cluster ml-pipeline service).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


class SubmitError(RuntimeError):
    """Submission failed; the message is one line naming the endpoint or the flag."""


@dataclass(frozen=True)
class Submission:
    host: str | None
    namespace: str | None = None
    token: str | None = None
    in_cluster: bool = False
    experiment: str = "longturn"
    run_name: str | None = None
    caching: bool = True


def git_commit(repo: Path) -> str:
    """`git rev-parse --short HEAD` of the repo the pipeline was compiled from ("nogit": none)."""
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo,
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "nogit"
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "nogit"


def default_run_name(repo: Path, now: float | None = None) -> str:
    """longturn-<commit>-<UTC time>: unique per submission, traceable to the code."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
    return f"longturn-{git_commit(repo)}-{stamp}"


def client_kwargs(s: Submission) -> dict:
    """kfp.Client's arguments for this submission's auth."""
    kwargs: dict = {"host": s.host}
    if s.namespace is not None:
        kwargs["namespace"] = s.namespace
    if s.token is not None:
        kwargs["existing_token"] = s.token
    elif s.in_cluster:
        from kfp.client import KF_PIPELINES_SA_TOKEN_ENV, KF_PIPELINES_SA_TOKEN_PATH
        from kfp.client.set_volume_credentials import ServiceAccountTokenVolumeCredentials

        path = os.environ.get(KF_PIPELINES_SA_TOKEN_ENV) or KF_PIPELINES_SA_TOKEN_PATH
        if not Path(path).is_file():
            raise SubmitError(f"--in-cluster: no service-account token at {path} (run inside a "
                              "Kubeflow pod or notebook, or pass --token)")
        kwargs["credentials"] = ServiceAccountTokenVolumeCredentials(path)
    return kwargs


def submit(package: str, s: Submission, repo: Path) -> tuple[str, str]:
    """Create the run; returns (run id, run name). Any failure is a SubmitError."""
    if s.host is None and not s.in_cluster:
        raise SubmitError("submit needs --host (the Kubeflow Pipelines endpoint), or "
                          "--in-cluster inside the cluster")
    kwargs = client_kwargs(s)
    run_name = s.run_name or default_run_name(repo)
    where = s.host or "the in-cluster endpoint"
    import warnings

    import kfp

    try:
        with warnings.catch_warnings():  # kfp warns about backend versions on every client
            warnings.simplefilter("ignore", FutureWarning)
            client = kfp.Client(**kwargs)
        run = client.create_run_from_pipeline_package(
            package, run_name=run_name, experiment_name=s.experiment, namespace=s.namespace,
            enable_caching=s.caching)
    except Exception as err:  # kfp raises bare connection and API errors
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise SubmitError(f"could not submit to {where}: {first_line}") from None
    return run.run_id, run_name
