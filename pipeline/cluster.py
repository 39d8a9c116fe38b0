"""What each Kubeflow task asks of the cluster: GPUs, CPU and memory requests, a RAM-backed
/dev/shm, the PersistentVolumeClaim, and GPU-node placement.

All of it comes from `kubeflow:` in the params file; CLI flags override it per submission. Under
`kfp.local` none of it applies (the local runner ignores Kubernetes settings), so `local` runs
get the display names and caching only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from kfp import dsl
from pydantic import ValidationError

from longturn.params.config import KubeflowParams, Params, ParamsError, PodResources

GPU = "nvidia.com/gpu"
SHM_VOLUME = "shm"
OBJECT_STORES = ("gs://", "s3://", "minio://")  # what a KFP importer can fetch on a cluster


@dataclass(frozen=True)
class Cluster:
    """The cluster settings of one compile: params.kubeflow with the CLI's overrides applied."""

    image: str = "longturn:gpu"
    kubeflow: KubeflowParams = field(default_factory=KubeflowParams)
    local: bool = False      # kfp.local: no Kubernetes settings at all
    retries: int = 2         # train segments only: they resume from their checkpoints
    caching: bool = True

    def resources(self, stage: str) -> PodResources:
        return getattr(self.kubeflow.resources, stage)


def with_overrides(kubeflow: KubeflowParams, overrides: dict[str, Any]) -> KubeflowParams:
    """params.kubeflow with the CLI's values (None: not given) on top, validated again."""
    data = kubeflow.model_dump()
    for key, value in overrides.items():
        if value is None:
            continue
        if key in ("gpus", "eval_gpus"):  # --gpus: train tasks; --eval-gpus: every other GPU task
            stages = ["train"] if key == "gpus" else ["validate_prompts", "eval", "critic_warmup"]
            for stage in stages:
                data["resources"][stage]["gpus"] = value
        else:
            data[key] = value
    try:
        return KubeflowParams.model_validate(data)
    except ValidationError as err:
        problems = [e["msg"].removeprefix("Value error, ") if not e["loc"] else
                    f"kubeflow.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors()]
        raise ParamsError(f"with the command-line overrides: {'; '.join(problems)}") from None


def check_model_source(params: Params, kubeflow: KubeflowParams, local: bool) -> str | None:
    """Stop a compile whose prepare_model cannot see its model; returns a warning or None."""
    from longturn.run.models import EMBEDDED

    if kubeflow.model_uri is not None:
        if not local and not kubeflow.model_uri.startswith(OBJECT_STORES):
            raise ParamsError(f"kubeflow.model_uri {kubeflow.model_uri!r}: a cluster imports only "
                              f"{', '.join(OBJECT_STORES)} URIs")
        return None
    source = params.model.source
    if local or source in EMBEDDED:
        return None
    if kubeflow.pvc is None:
        return (f"model.source {source!r} must exist inside the image: no volume is mounted "
                "(set kubeflow.pvc, or kubeflow.model_uri)")
    if not PurePosixPath(source).is_relative_to(kubeflow.mount_path):
        raise ParamsError(f"model.source {source!r} is not under kubeflow.mount_path "
                          f"{kubeflow.mount_path!r}, so prepare_model cannot see it (put the model "
                          "on the volume, or set kubeflow.model_uri)")
    return None


def place(task: dsl.PipelineTask, name: str, stage: str, cluster: Cluster,
          volume: bool = False) -> dsl.PipelineTask:
    """Display name, caching, and (on a cluster) the requests, /dev/shm, the volume when the
    task needs it, and GPU-node placement for tasks that ask for GPUs."""
    task.set_display_name(name).set_caching_options(cluster.caching)
    if cluster.local:
        return task
    from kfp import kubernetes

    r, k = cluster.resources(stage), cluster.kubeflow
    task.set_cpu_request(r.cpu).set_memory_request(r.memory)
    if r.shm is not None:
        kubernetes.empty_dir_mount(task, volume_name=SHM_VOLUME, mount_path="/dev/shm",
                                   medium="Memory", size_limit=r.shm)
    if volume and k.pvc is not None:
        kubernetes.mount_pvc(task, pvc_name=k.pvc, mount_path=k.mount_path)
    if r.gpus > 0:
        task.set_accelerator_type(GPU).set_accelerator_limit(r.gpus)
        for label, value in k.node_selector.items():
            kubernetes.add_node_selector(task, label_key=label, label_value=value)
        for t in k.tolerations:
            kubernetes.add_toleration(task, key=t.key, operator=t.operator, value=t.value,
                                      effect=t.effect)
    return task


def secrets_as_env(task: dsl.PipelineTask, secret_env: dict[str, dict[str, str]]) -> None:
    """Each Secret's keys as env variables of `task` (`kubeflow.secret_env`)."""
    if not secret_env:
        return
    from kfp import kubernetes

    for secret, keys in secret_env.items():
        kubernetes.use_secret_as_env(task, secret_name=secret, secret_key_to_env=keys)
