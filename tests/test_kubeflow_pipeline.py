"""The Kubeflow pipeline: compiled from the GPU profile (segments and their artifacts, the volume,
requests, /dev/shm, GPU-node placement, retries, image), run whole with kfp.local at toy size
(every task here, in this interpreter), and submit's auth, run name and errors."""

from __future__ import annotations

import hashlib
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import free_port
from longturn.params.file import render
from pipeline.build import segment_ends
from pipeline.params_text import without_section
from test_pipeline_smoke import ROOT, toy_params, write_params

PROFILE_TEXT = render(ROOT / "configs/profiles/gpu.yaml")  # as `make params PROFILE=gpu` writes it


def gpu_params(tmp_path: Path) -> Path:
    path = tmp_path / "params-gpu.yaml"
    path.write_text(PROFILE_TEXT)
    return path


def pipeline_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)


def compile_profile(tmp_path: Path, *flags: str, params: Path | None = None) -> "Compiled":
    out = tmp_path / "longturn.yaml"
    params = params or gpu_params(tmp_path)
    done = pipeline_cli("compile", "--params", str(params), "--out", str(out),
                        "--image", "registry.example/longturn:1", *flags)
    assert done.returncode == 0, done.stderr[-2000:]
    return Compiled(out)


class Compiled:
    """The two YAML documents kfp writes: the pipeline spec and its Kubernetes platform spec."""

    def __init__(self, path: Path):
        docs = list(yaml.safe_load_all(path.read_text()))
        self.spec = docs[0]
        self.k8s = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"] \
            if len(docs) > 1 else {}
        self.tasks = self.spec["root"]["dag"]["tasks"]

    def named(self, name: str) -> tuple[str, dict]:
        return next((k, t) for k, t in self.tasks.items() if t["taskInfo"]["name"] == name)

    def segments(self) -> list[tuple[str, dict]]:
        found = [(k, t) for k, t in self.tasks.items()
                 if t["taskInfo"]["name"].startswith("train to")]
        return sorted(found, key=lambda kt: int(kt[1]["taskInfo"]["name"].rsplit(" ", 1)[1]))

    def executor(self, task: dict) -> str:
        return self.spec["components"][task["componentRef"]["name"]]["executorLabel"]

    def container(self, task: dict) -> dict:
        return self.spec["deploymentSpec"]["executors"][self.executor(task)]["container"]

    def platform(self, task: dict) -> dict:
        return self.k8s.get(self.executor(task), {})

    def outputs(self, task: dict) -> dict[str, str]:
        defs = self.spec["components"][task["componentRef"]["name"]]["outputDefinitions"]
        return {k: v["artifactType"]["schemaTitle"] for k, v in defs["artifacts"].items()}


@pytest.mark.parametrize("iterations, per_task, ends", [
    (5, 2, [2, 4, 5]), (4, 1, [1, 2, 3, 4]), (3, 10, [3]), (200, 10, list(range(10, 201, 10)))])
def test_segment_ends(iterations, per_task, ends):
    assert segment_ends(iterations, per_task) == ends


def test_gpu_profile_segments_pass_one_checkpoint_forward_and_keep_their_own_trajectories(tmp_path):
    c = compile_profile(tmp_path)
    # prepare, validate, zero-shot, warm-up, 20 segments, final eval, report
    assert len(c.tasks) == 26
    segments = c.segments()
    assert segments[-1][1]["taskInfo"]["name"] == "train to iteration 200" and len(segments) == 20
    for i, (key, task) in enumerate(segments):
        artifacts = task["inputs"]["artifacts"]
        expected = {"base_model", "warmup"} | ({"previous"} if i else set())
        assert set(artifacts) == expected, f"{key} consumes {sorted(artifacts)}"
        if i:
            source = artifacts["previous"]["taskOutputArtifact"]
            assert source == {"producerTask": segments[i - 1][0], "outputArtifactKey": "checkpoint"}
        outputs = {"checkpoint": "system.Model", "trajectories": "system.Dataset"}
        if i == len(segments) - 1:
            outputs |= {"actor": "system.Model", "live": "system.Artifact"}
        assert c.outputs(task) == outputs
        assert task["retryPolicy"]["maxRetryCount"] == 2
        assert task["cachingOptions"]["enableCache"] is True
    last = segments[-1][0]
    _, final = c.named("final_eval")
    assert final["inputs"]["artifacts"]["model"]["taskOutputArtifact"] == {
        "producerTask": last, "outputArtifactKey": "actor"}
    _, report = c.named("report")
    assert report["inputs"]["artifacts"]["train_live"]["taskOutputArtifact"]["producerTask"] == last


def test_gpu_profile_tasks_mount_the_volume_and_ask_for_requests_shm_and_gpu_nodes(tmp_path):
    c = compile_profile(tmp_path)
    profile = yaml.safe_load(PROFILE_TEXT)["kubeflow"]
    shm = {"medium": "Memory", "mountPath": "/dev/shm", "volumeName": "shm"}
    for name in ["prepare_model", "validate_prompts", "zero_shot_eval", "critic_warmup",
                 "train to iteration 10", "train to iteration 200", "final_eval", "report"]:
        _, task = c.named(name)
        stage = {"zero_shot_eval": "eval", "final_eval": "eval"}.get(name, name)
        stage = "train" if name.startswith("train to") else stage
        want = profile["resources"][stage]
        container, platform = c.container(task), c.platform(task)
        assert container["image"] == "registry.example/longturn:1"
        assert container["resources"]["resourceCpuRequest"] == want["cpu"], name
        assert container["resources"]["resourceMemoryRequest"] == want["memory"], name
        mounts = platform.get("emptyDirMounts", [])
        assert mounts == ([{**shm, "sizeLimit": want["shm"]}] if want["shm"] else []), name
        gpu = container["resources"].get("accelerator", {})
        if want["gpus"]:
            assert gpu["resourceCount"] == str(want["gpus"])
            assert gpu["resourceType"] == "nvidia.com/gpu"
            assert platform["nodeSelector"]["labels"] == profile["node_selector"], name
            assert platform["tolerations"] == [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}], name
        else:
            assert not gpu and "nodeSelector" not in platform and "tolerations" not in platform
        volume = name == "prepare_model" or name.startswith("train to")
        pvc = [(m["pvcNameParameter"]["runtimeValue"]["constant"], m["mountPath"])
               for m in platform.get("pvcMount", [])]
        assert pvc == ([("longturn", "/models")] if volume else []), name
    _, train = c.named("train to iteration 10")
    work = {"name": "LONGTURN_WORK_DIR", "value": "/models/longturn-work"}
    assert work in c.container(train)["env"]
    assert "/models/Qwen2.5-3B-Instruct" == yaml.safe_load(PROFILE_TEXT)["model"]["source"]


def test_params_compiled_in_are_the_file_without_its_cluster_section(tmp_path):
    c = compile_profile(tmp_path)
    _, prepare = c.named("prepare_model")
    compiled = prepare["inputs"]["parameters"]["params_yaml"]["runtimeValue"]["constant"]
    assert compiled == without_section(PROFILE_TEXT)
    assert "\nkubeflow:" not in compiled and "# profile: gpu" in compiled  # comments kept
    expected = yaml.safe_load(PROFILE_TEXT)
    del expected["kubeflow"]
    assert yaml.safe_load(compiled) == expected


@pytest.mark.parametrize("text", [
    "seed: 0\nkubeflow:\n  pvc: x   # a claim\n  tolerations:\n  - {key: a}\n# trailing\n"
    "train:\n  iterations: 2\n",
    "seed: 0\nkubeflow: {pvc: x, mount_path: /m}\ntrain: {iterations: 2}\n",
    "seed: 0\ntrain: {iterations: 2}\n"])
def test_without_section_drops_only_the_cluster_section(text):
    expected = {k: v for k, v in yaml.safe_load(text).items() if k != "kubeflow"}
    assert yaml.safe_load(without_section(text)) == expected


def test_flags_override_the_volume_and_import_the_model_from_an_object_store(tmp_path):
    c = compile_profile(tmp_path, "--pvc", "team-volume", "--mount-path", "/mnt/lt",
                        "--work-dir", "/mnt/lt/work", "--model-uri", "s3://bucket/Qwen2.5-3B",
                        "--gpus", "4")
    key, prepare = c.named("prepare_model")
    source = prepare["inputs"]["artifacts"]["source"]["taskOutputArtifact"]["producerTask"]
    importer = c.spec["deploymentSpec"]["executors"][c.executor(c.tasks[source])]["importer"]
    assert importer["artifactUri"]["constant"] == "s3://bucket/Qwen2.5-3B"
    assert "pvcMount" not in c.platform(prepare)  # the model comes from the object store
    _, train = c.named("train to iteration 10")
    assert c.platform(train)["pvcMount"][0]["mountPath"] == "/mnt/lt"
    assert c.platform(train)["pvcMount"][0]["constant"] == "team-volume"
    assert c.container(train)["resources"]["accelerator"]["resourceCount"] == "4"


def test_secrets_become_env_variables_of_train_tasks_only(tmp_path):
    profile = yaml.safe_load(PROFILE_TEXT)
    profile["kubeflow"]["secret_env"] = {"s3-creds": {"id": "AWS_ACCESS_KEY_ID",
                                                      "secret": "AWS_SECRET_ACCESS_KEY"}}
    profile["train"].update(push=True, remote="s3://bucket/longturn")
    c = compile_profile(tmp_path, params=write_params(tmp_path / "p.yaml", profile))
    for name, task in ((t["taskInfo"]["name"], t) for t in c.tasks.values()):
        found = c.platform(task).get("secretAsEnv", [])
        if name.startswith("train to"):
            (secret,) = found
            assert secret["secretName"] == "s3-creds"
            assert {(k["secretKey"], k["envVar"]) for k in secret["keyToEnv"]} == {
                ("id", "AWS_ACCESS_KEY_ID"), ("secret", "AWS_SECRET_ACCESS_KEY")}
        else:
            assert found == [], name


@pytest.mark.parametrize("flags, message", [
    (["--mount-path", "/data", "--work-dir", "/data/work"],
     "model.source '/models/Qwen2.5-3B-Instruct' is not under kubeflow.mount_path '/data'"),
    (["--mount-path", "/data"], "kubeflow.work_dir '/models/longturn-work' is not under"),
    (["--model-uri", "/local/dir"], "kubeflow.model_uri '/local/dir': a cluster imports only"),
])
def test_a_model_the_pods_cannot_see_stops_the_compile(tmp_path, flags, message):
    out = tmp_path / "p.yaml"
    done = pipeline_cli("compile", "--params", str(gpu_params(tmp_path)), "--out", str(out), *flags)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not out.exists()


def test_whole_pipeline_runs_locally_at_toy_size(tmp_path, tiny_model_dir):
    params = toy_params(tiny_model_dir)
    params["model"]["source"] = str(tmp_path / "not-here")  # the imported model must win
    params["kubeflow"]["model_uri"] = tiny_model_dir
    params["env"].update(tasks=["goto"])
    params["eval"].update(tasks=["goto"], episodes_per_task=2)
    bucket = tmp_path / "bucket"  # train.push with a URL remote: each segment uploads as it goes
    params["train"].update(iterations=2, iterations_per_task=1, push=True, remote=str(bucket))
    path = write_params(tmp_path / "params.yaml", params)
    done = pipeline_cli("local", "--params", path, "--root", str(tmp_path / "kfp"))
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    root = tmp_path / "kfp"
    reports = list(root.rglob("report/report.md"))
    assert len(reports) == 1 and "zero-shot" in reports[0].read_text().lower()
    # one checkpoint per segment, holding that segment's last iteration only
    checkpoints = sorted(sorted(p.name for p in d.iterdir()) for d in root.rglob("checkpoint"))
    assert checkpoints == [["iteration=0000"], ["iteration=0001"]]
    # each segment's trajectories are its own iteration only (nothing copied forward)
    datasets = sorted(sorted(p.name for p in d.iterdir()) for d in root.rglob("trajectories")
                      if d.parent.name != "pushed")
    assert datasets == [["iteration=0000", "pushed"], ["iteration=0001", "pushed"]]
    # ... and the pointers of what it pushed, for a clone to `dvc pull`
    for dataset in root.rglob("trajectories"):
        if dataset.parent.name != "pushed":
            pushed = sorted(p.relative_to(dataset).as_posix() for p in dataset.rglob("*.dvc"))
            assert f"pushed/trajectories/{sorted(dataset.glob('iteration=*'))[0].name}.dvc" in pushed
    for part in root.rglob("trajectories/iteration=*/part-00.parquet"):
        assert len(pd.read_parquet(part)) == 6
        digest = hashlib.md5(part.read_bytes()).hexdigest()
        assert (bucket / "files/md5" / digest[:2] / digest[2:]).is_file()
    (last,) = list(root.rglob("train-last-segment"))
    assert (last / "actor" / "config.json").is_file()
    # the last segment resumed with the first one's history: its curves cover both iterations
    curve = (last / "live" / "plots" / "metrics" / "train" / "success_rate.tsv").read_text()
    assert [line.split("\t")[0] for line in curve.splitlines()] == ["step", "0", "1"]
    # resumed, not redone: iteration 0's history entry (with its wall-clock timings) is the one
    # the first segment recorded
    (first,) = list(root.rglob("train-segment"))
    before = pickle.loads((first / "checkpoint/iteration=0000/history.pkl").read_bytes())
    after = pickle.loads((last / "checkpoint/iteration=0001/history.pkl").read_bytes())
    assert len(before) == 1 and len(after) == 2
    # as JSON, where the NaNs of what was not counted (tool calls without conversations) are equal
    assert json.dumps(after[0], sort_keys=True) == json.dumps(before[0], sort_keys=True)
    finals = [json.loads(p.read_text()) for p in root.rglob("evaluation/metrics.json")]
    assert len(finals) == 2 and all(m["overall"]["episodes"] == 2 for m in finals)


def test_submit_names_an_unreachable_host(tmp_path):
    host = f"http://127.0.0.1:{free_port()}"
    done = pipeline_cli("submit", "--params", "params.yaml", "--out", str(tmp_path / "p.yaml"),
                        "--host", host)
    assert done.returncode == 2 and f"could not submit to {host}" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert (tmp_path / "p.yaml").is_file()  # compiled before submitting


class FakeClient:
    """Stands in for kfp.Client: records what submit would send."""

    calls: list[tuple[str, dict]] = []

    def __init__(self, **kwargs):
        FakeClient.calls.append(("client", kwargs))

    def create_run_from_pipeline_package(self, package, **kwargs):
        FakeClient.calls.append(("run", {"package": package, **kwargs}))
        return type("Run", (), {"run_id": "run-123"})()


@pytest.fixture
def fake_kfp(monkeypatch):
    import kfp

    FakeClient.calls = []
    monkeypatch.setattr(kfp, "Client", FakeClient)
    return FakeClient.calls


def test_submit_sends_namespace_token_experiment_and_a_run_name_with_the_commit(
        tmp_path, fake_kfp, capsys):
    from pipeline.__main__ import main

    code = main(["submit", "--params", "params.yaml", "--out", str(tmp_path / "p.yaml"),
                 "--host", "https://kfp.example", "--namespace", "team-a", "--token", "tok",
                 "--experiment", "qwen-goto"])
    assert code == 0, capsys.readouterr().err
    (_, client), (_, run) = fake_kfp
    assert client == {"host": "https://kfp.example", "namespace": "team-a", "existing_token": "tok"}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip() or "nogit"
    assert run["run_name"].startswith(f"longturn-{commit}-")
    assert run["experiment_name"] == "qwen-goto" and run["namespace"] == "team-a"
    assert run["package"] == str(tmp_path / "p.yaml") and run["enable_caching"] is True
    assert f"submitted run {run['run_name']} (run-123)" in capsys.readouterr().out


def test_in_cluster_auth_reads_the_pods_token(tmp_path, fake_kfp, monkeypatch, capsys):
    from kfp.client import ServiceAccountTokenVolumeCredentials

    from pipeline.__main__ import main

    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(tmp_path / "missing"))
    args = ["submit", "--params", "params.yaml", "--out", str(tmp_path / "p.yaml"), "--in-cluster",
            "--run-name", "mine"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("pipeline: error: --in-cluster: no service-account token at "
                   f"{tmp_path / 'missing'} (run inside a Kubeflow pod or notebook, "
                   "or pass --token)")
    (tmp_path / "token").write_text("sa-token")
    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(tmp_path / "token"))
    assert main(args) == 0
    (_, client), (_, run) = fake_kfp
    assert client["host"] is None and isinstance(client["credentials"],
                                                 ServiceAccountTokenVolumeCredentials)
    assert run["run_name"] == "mine"


def test_token_and_in_cluster_exclude_each_other_and_submit_needs_an_endpoint(tmp_path):
    done = pipeline_cli("submit", "--params", "params.yaml", "--token", "t", "--in-cluster")
    assert done.returncode == 2 and "not allowed with argument" in done.stderr
    done = pipeline_cli("submit", "--params", "params.yaml", "--out", str(tmp_path / "p.yaml"))
    assert done.returncode == 2 and "submit needs --host" in done.stderr


def test_bad_params_stop_before_compiling(tmp_path):
    bad = tmp_path / "params.yaml"
    bad.write_text("train:\n  iterations: 0\n")
    done = pipeline_cli("compile", "--params", str(bad), "--out", str(tmp_path / "p.yaml"))
    assert done.returncode == 2 and "train.iterations" in done.stderr
    assert not (tmp_path / "p.yaml").exists()
