"""The SGLang engine against a stand-in server that speaks SGLang's HTTP protocol (no GPU here).

The stand-in (tests/sglang_standin, put on PYTHONPATH by the `standin_env` fixture) is launched
exactly as the real server would be, through `python -m sglang.launch_server` with the flags
longturn builds, and decodes with its own loop, so these tests check the launch, the wire format,
logprob semantics, weight updates and shutdown.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from conftest import free_port
from longturn.params.config import SGLangParams
from longturn.engines import sglang as sglang_module
from longturn.engines.row_seeds import row_seed
from longturn.engines.sglang import (
    SGLangEngine, make_sglang_engine, model_stop_ids, parse_completion, request_body)
from longturn.engines.sglang_server import SGLangError, health_ok
from settings_from_params import sampling_settings


def settings(log_dir: Path, **overrides) -> SGLangParams:
    """Stand-in settings; the server log goes under the test's `log_dir`, never the system tmp."""
    return SGLangParams(**{"python": sys.executable, "port": free_port(), "log_dir": str(log_dir),
                           "startup_timeout_s": 120, "request_timeout_s": 120, **overrides})


def forward_logprobs(model_dir: str, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """Untempered logprob of each response token under a plain forward pass."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()
    steps = logits[len(prompt) - 1 : len(prompt) + len(tokens) - 1].log_softmax(-1)
    return steps.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


def test_request_body_maps_top_k_and_seeds_each_prompt():
    sampling = sampling_settings(max_new_tokens=5, temperature=0.7, top_k=0)
    body = request_body([[1, 2], [3]], replace(sampling, seed=11), {7, 2})
    assert body["input_ids"] == [[1, 2], [3]]
    assert body["return_logprob"] is True and body["logprob_start_len"] == -1
    first, second = body["sampling_params"]
    assert first["top_k"] == -1 and first["temperature"] == 0.7 and first["max_new_tokens"] == 5
    assert first["stop_token_ids"] == [2, 7] and first["no_stop_trim"] is True
    assert (first["sampling_seed"], second["sampling_seed"]) == (row_seed(11, 0), row_seed(11, 1))
    own = request_body([[1, 2], [3]], replace(sampling, seed=(5, 9)), {2})["sampling_params"]
    assert [p["sampling_seed"] for p in own] == [5, 9]  # evaluation episodes' own seeds
    unseeded = request_body([[1]], sampling_settings(top_k=20), {2})["sampling_params"][0]
    assert "sampling_seed" not in unseeded and unseeded["top_k"] == 20


def test_parse_completion_keeps_a_trimmed_stop_token():
    trimmed = {"output_ids": [5, 6], "meta_info": {
        "finish_reason": {"type": "stop", "matched": 2},
        "output_token_logprobs": [[-0.1, 5, None], [-0.2, 6, None], [-0.3, 2, None]]}}
    done = parse_completion(trimmed)
    assert (done.token_ids, done.logprobs, done.finish_reason) == ([5, 6, 2], [-0.1, -0.2, -0.3], "stop")
    cut = parse_completion({"output_ids": [5], "meta_info": {
        "finish_reason": {"type": "length", "length": 1}, "output_token_logprobs": [[-1.5, 5, None]]}})
    assert cut.finish_reason == "length"


@pytest.mark.parametrize("item, message", [
    ({"output_ids": [1]}, "outside the protocol"),
    ({"output_ids": [9], "meta_info": {"finish_reason": {"type": "length"},
                                       "output_token_logprobs": [[-1.0, 5, None]]}}, "disagree"),
    ({"meta_info": {"finish_reason": {"type": "abort", "message": "client gone"},
                    "output_token_logprobs": []}}, "client gone"),
])
def test_parse_completion_names_what_is_wrong(item, message):
    with pytest.raises(SGLangError, match=message):
        parse_completion(item)


def test_each_rank_launches_its_own_server_at_port_plus_local_rank_on_its_own_gpus(
        tiny_model_dir, tmp_path, monkeypatch):
    """Under torchrun every rank starts a server of its own: at `port` + LOCAL_RANK, on the
    tp_size GPUs from LOCAL_RANK x tp_size (rank 1 with tp_size 2: GPUs 2 and 3)."""
    launched = []

    class Recorder:  # what the rank would start, not started
        def __init__(self, cmd, host, port, *_):
            launched.append(cmd)
            self.url = f"http://{host}:{port}"

        def start(self):
            return self

    monkeypatch.setattr(sglang_module, "SGLangServer", Recorder)
    monkeypatch.setenv("LOCAL_RANK", "1")
    engine = make_sglang_engine(tiny_model_dir, settings(tmp_path, port=30000, tp_size=2))
    (cmd,) = launched
    assert engine.base_url == "http://127.0.0.1:30001"
    flags = {flag: cmd[cmd.index(flag) + 1] for flag in ("--port", "--base-gpu-id", "--tp-size")}
    assert flags == {"--port": "30001", "--base-gpu-id": "2", "--tp-size": "2"}


def test_launched_server_generates_untempered_logprobs_and_reloads_weights(
        standin_env, tiny_model_dir, tmp_path):
    engine = make_sglang_engine(tiny_model_dir, settings(tmp_path, mem_fraction_static=0.4))
    server = engine.server
    try:
        prompts = [[1, 17, 300, 42], [1, 99], [1, 5, 6, 7, 8, 9]]
        sampling = sampling_settings(max_new_tokens=6, temperature=0.7, seed=3)
        completions = engine.generate(prompts, sampling)
        assert [c.token_ids for c in engine.generate(prompts, sampling)] == \
            [c.token_ids for c in completions]  # seeded: the same call, the same tokens
        for prompt, done in zip(prompts, completions):
            assert len(done.token_ids) == len(done.logprobs) >= 1
            assert done.finish_reason in ("stop", "length")
            if done.finish_reason == "stop":
                assert done.token_ids[-1] in engine.stop_ids
            expected = forward_logprobs(tiny_model_dir, prompt, done.token_ids)
            assert torch.allclose(torch.tensor(done.logprobs), expected, atol=1e-4)

        sent = [json.loads(line) for line in standin_env.read_text().splitlines()]
        generate_body = sent[0]["body"]
        assert sent[0]["route"] == "/generate" and generate_body["input_ids"] == prompts
        assert [sp["sampling_seed"] for sp in generate_body["sampling_params"]] == \
            [row_seed(3, i) for i in range(3)]
        assert set(generate_body["sampling_params"][0]["stop_token_ids"]) == \
            model_stop_ids(tiny_model_dir)

        changed = tmp_path / "changed"
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        with torch.no_grad():
            model.lm_head.weight.mul_(3.0)  # tied: every logit changes
        model.save_pretrained(changed)
        engine.update_weights(str(changed))
        after = engine.generate([prompts[0]], sampling_settings(max_new_tokens=4, seed=1))[0]
        expected = forward_logprobs(str(changed), prompts[0], after.token_ids)
        assert torch.allclose(torch.tensor(after.logprobs), expected, atol=1e-4)

        with pytest.raises(SGLangError, match="could not load weights"):
            engine.update_weights(str(tmp_path / "missing"))
    finally:
        engine.close()
    assert server.proc.poll() is not None and not health_ok(server.url)


def test_attaching_to_a_running_server_leaves_it_running(standin_env, tiny_model_dir, tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", "--model-path",
                             tiny_model_dir, "--port", str(port)], stdout=subprocess.DEVNULL)
    try:
        engine = SGLangEngine(f"http://127.0.0.1:{port}", model_stop_ids(tiny_model_dir))
        attached = make_sglang_engine(tiny_model_dir, settings(tmp_path, url=f"http://127.0.0.1:{port}"))
        assert attached.server is None
        for _ in range(600):
            if health_ok(engine.base_url):
                break
            assert proc.poll() is None
            time.sleep(0.1)
        assert len(attached.generate([[1, 2, 3]], sampling_settings(max_new_tokens=2))[0].token_ids) >= 1
        attached.close()
        assert proc.poll() is None and health_ok(engine.base_url)
    finally:
        proc.kill()
        proc.wait()


def test_a_server_that_dies_at_startup_is_reported_with_its_log(standin_env, tiny_model_dir,
                                                                 tmp_path):
    with pytest.raises(SGLangError, match="exited with code") as err:
        make_sglang_engine(tiny_model_dir, settings(tmp_path / "logs", extra_args=["--no-such-flag"]))
    assert "unrecognized arguments: --no-such-flag" in str(err.value)
    [log] = (tmp_path / "logs").glob("sglang-*.log")  # engine.sglang.log_dir, created; kept
    assert f"last lines of {log}" in str(err.value)


def test_launch_errors_name_the_setting(standin_env, tiny_model_dir, tmp_path):
    with pytest.raises(SGLangError, match="engine.sglang.python"):
        make_sglang_engine(tiny_model_dir, SGLangParams(python="/nonexistent/python3",
                                                         port=free_port(), log_dir=str(tmp_path)))
    assert not list(tmp_path.glob("sglang-*"))  # nothing ran: no empty log left behind
    blocked = tmp_path / "a_file"
    blocked.touch()
    with pytest.raises(SGLangError, match=f"engine.sglang.log_dir '{blocked}/logs' cannot be"):
        make_sglang_engine(tiny_model_dir, settings(blocked / "logs"))
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(SGLangError, match=f"port {port} .* already in use"):
            make_sglang_engine(tiny_model_dir, settings(tmp_path, port=port))


def test_the_server_dies_with_a_killed_stage(standin_env, tiny_model_dir, tmp_path):
    port = free_port()
    script = tmp_path / "stage.py"
    script.write_text(
        "import sys, time\n"
        "from longturn.params.config import SGLangParams\n"
        "from longturn.engines.sglang import make_sglang_engine\n"
        f"make_sglang_engine({tiny_model_dir!r}, SGLangParams(python=sys.executable, port={port},"
        f" log_dir={str(tmp_path)!r}))\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n")
    stage = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[1])
    try:
        assert stage.stdout.readline().strip() == "ready"
        assert health_ok(f"http://127.0.0.1:{port}")
        stage.kill()  # SIGKILL: no finally, no close()
        stage.wait()
        deadline = time.monotonic() + 30
        while health_ok(f"http://127.0.0.1:{port}"):
            assert time.monotonic() < deadline, "the server outlived its killed stage"
            time.sleep(0.2)
    finally:
        stage.kill()
