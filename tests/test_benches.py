"""Every script in bench/ runs end to end in its --tiny mode and prints what a reader looks for.

Benches are run as a reader runs them (a subprocess from the repository root), so a bench that
crashes, or stops printing its ratio lines, fails here. No test asserts on a time: the ratios are
measurements, only their presence and shape are checked. The pure helpers the benches rely on
(GPU-memory arithmetic, token counting, the side-by-side variants) are tested directly.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
TIMEOUT_S = 300
GIB = 1 << 30


def run_bench(script: str, *args: str) -> str:
    """stdout of `python bench/<script> args...`; fails with the output tail on a non-zero exit."""
    proc = subprocess.run([sys.executable, str(BENCH / script), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, (f"{script} exited {proc.returncode}\n--- stdout\n"
                                  f"{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")
    return proc.stdout


def load_bench(script: str) -> ModuleType:
    """Import bench/<script> as a module (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{Path(script).stem}", BENCH / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One tiny model for every bench of this file (building it reads a GGUF: seconds)."""
    out = tmp_path_factory.mktemp("bench_tiny") / "model"
    assert "tiny model ready" in run_bench("tiny_model.py", str(out))
    return str(out)


def number(pattern: str, text: str) -> float:
    """The first group of `pattern` in `text` as a float; fails when the line is missing."""
    match = re.search(pattern, text)
    assert match, f"no line matching {pattern!r} in:\n{text}"
    return float(match.group(1))


# ---- the benches, end to end --------------------------------------------------------------

def test_gae_tiny() -> None:
    out = run_bench("gae.py", "--tiny")
    assert "16 turns x 64 tokens" in out
    assert number(r"speed-up \(median\)\s*:\s*([\d.]+)x", out) > 0
    assert "results agree" in out


def test_parse_speed_tiny() -> None:
    out = run_bench("parse_speed.py", "--tiny")
    rows = re.findall(r"^  (\S.*?)\s+([\d.]+) ms\s+([\d.]+) ms\s+([\d.]+)x$", out, re.MULTILINE)
    assert len(rows) == 9, out  # 4 reply shapes, 5 tool-call shapes, both sizes side by side
    assert {"many ACTION tags", "unclosed <tool_call> tags", "calls nested 400 deep"} <= {
        name for name, *_ in rows}
    assert number(r"slowest reply at 2 kB: ([\d.]+) ms", out) >= 0


def test_tiny_model_is_reused_and_foreign_dirs_are_refused(tiny_dir: str, tmp_path: Path) -> None:
    tiny = load_bench("tiny_model.py")
    before = (Path(tiny_dir) / "model.safetensors").stat().st_mtime_ns
    assert tiny.ensure_tiny_model(Path(tiny_dir)) == tiny_dir
    assert (Path(tiny_dir) / "model.safetensors").stat().st_mtime_ns == before  # not rebuilt
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not a model")
    with pytest.raises(tiny.TinyModelError, match="not empty and holds no model"):
        tiny.ensure_tiny_model(foreign)
    assert (foreign / "notes.txt").read_text() == "not a model"
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text('{"hidden_size": 576, "num_hidden_layers": 30}')
    with pytest.raises(tiny.TinyModelError, match="not the tiny one"):
        tiny.ensure_tiny_model(other)


def test_ppo_update_tiny(tiny_dir: str) -> None:
    out = run_bench("ppo_update.py", "--tiny", "--tiny-dir", tiny_dir)
    assert "PPO update (plain): 4 turns (2 envs x 2)" in out
    assert number(r"ratio \(MFU-like\)\s*:\s*([\d.]+)", out) > 0
    assert "side by side" in out
    depths = dict(re.findall(r"^  (\S.*?)\s+trunk (\d)/2 ", out, re.MULTILINE))
    assert depths["plain"] == "0"
    assert depths["LoRA top 1, trunk off"] == "0" and depths["LoRA top 1, trunk on"] == "1"
    assert depths["shared prefix + LoRA top 1, trunk on"] == "1"
    assert any(name.endswith("(= params.yaml)") for name in depths)
    for label in ("LoRA top 1", "shared prefix + LoRA top 1"):
        assert number(rf"shared trunk on vs off \({re.escape(label)}\): x\s*([\d.]+)", out) > 0


def test_trunk_reuse_tiny(tiny_dir: str) -> None:
    out = run_bench("trunk_reuse.py", "--tiny", "--tiny-dir", tiny_dir)
    assert "trunk 1 of 2 layers" in out
    assert number(r"kept\s*:\s*([\d.]+) MiB", out) > 0
    # the new update and refit ran no trunk pass of their own: every batch was assembled
    assert re.search(r"update\s+new : .*\(trunk: [1-9]\d* batches assembled, 0 run\)", out)
    assert re.search(r"warm-up refit new : .*\(trunk: [1-9]\d* batches assembled, 0 run\)", out)
    for phase in ("update", "warm-up refit"):
        assert number(rf"(?m)^{phase}: old .*: x\s*([\d.]+)", out) > 0


def test_prefix_cache_tiny(tiny_dir: str) -> None:
    out = run_bench("prefix_cache.py", "--tiny", "--tiny-dir", tiny_dir)
    assert number(r"speed-up \(median\)\s*:\s*([\d.]+)x", out) > 0
    assert out.count("-> ok") == 2  # greedy and seeded float32 checks


def test_cpu_engine_cuts_tiny(tiny_dir: str) -> None:
    out = run_bench("cpu_engine_cuts.py", "--tiny", "--tiny-dir", tiny_dir)
    for name in ("before", "+ kept prefix", "+ chunked prefill", "+ fused prefill attention",
                 "+ dropped rows", "all four"):
        assert number(rf"{re.escape(name)}\s*:\s*[\d.]+ s per call\s+x\s*([\d.]+)", out) > 0
    # each variant says whether it sampled what "before" did: other chunk shapes, batch sizes or
    # the fused kernel may move logits in the last bits and flip a draw on a boundary; a kept
    # prefix is bit for bit the pass it replaces
    assert out.count("(same tokens)") + out.count("(OTHER TOKENS)") == 6
    assert re.search(r"\+ kept prefix .*\(same tokens\)", out)


def test_rollout_throughput_tiny(tiny_dir: str) -> None:
    out = run_bench("rollout_throughput.py", "--tiny", "--tiny-dir", tiny_dir)
    assert number(r"ratio batched / one-at-a-time: ([\d.]+)x", out) > 0
    assert number(r"canned replies : .* ratio workers / in-process ([\d.]+)x", out) > 0


def test_turn_cost_tiny(tiny_dir: str) -> None:
    out = run_bench("turn_cost.py", "--tiny", "--tiny-dir", tiny_dir, "--fast-forward")
    assert "fast-forward" in out
    assert number(r"ratio late / early: time ([\d.]+)x", out) > 0


def test_conversation_batches_tiny(tiny_dir: str) -> None:
    out = run_bench("conversation_batches.py", "--tiny", "--tiny-dir", tiny_dir)
    assert number(r"ratio late / early: ([\d.]+)x", out) > 0
    # replies handed on in a batch are let go: a running episode keeps no window of them
    assert re.search(r"keeps 0 reply windows", out)


def test_iteration_cost_tiny(tiny_dir: str) -> None:
    out = run_bench("iteration_cost.py", "--tiny", "--tiny-dir", tiny_dir)
    for name in ("gae", "gigpo"):
        assert number(rf"{name}\s*: ([\d.]+) s/turn over 16 turns", out) > 0
    assert number(r"ratio gae / gigpo: ([\d.]+)x", out) > 0


def test_engine_throughput_tiny(tiny_dir: str) -> None:
    out = run_bench("engine_throughput.py", "--tiny", "--tiny-dir", tiny_dir)
    assert "shared prefix" in out
    for size in (2, 4):
        assert f"batch {size}:" in out
    assert len(re.findall(r"engine \(static\)\s*:\s*[\d.]+ tok/s", out)) == 2
    assert len(re.findall(r"engine \(generic\)\s*:\s*[\d.]+ tok/s", out)) == 2
    assert len(re.findall(r"generate\(\)\s*:\s*[\d.]+ tok/s", out)) == 2
    assert len(re.findall(r"ratio engine / generate\(\):\s*[\d.]+x", out)) == 2


def test_gpu_memory_tiny(tiny_dir: str) -> None:
    out = run_bench("gpu_memory.py", "--tiny", "--tiny-dir", tiny_dir)
    assert "with the settings of gpu.yaml" in out and "zero_stage=2" in out
    for phase in ("load", "score", "update"):
        assert number(rf"{phase}\s*:\s*([\d.]+) GiB", out) > 0
    assert "ZeRO-2 over 8 ranks" in out and "gradients" in out
    assert number(r"sglang server share\s*:\s*([\d.]+) GiB", out) == pytest.approx(28.0)
    assert re.search(r"estimate per GPU\s*:\s*[\d.]+ GiB of 80 GiB -> (fits|does NOT fit)", out)


# ---- the helpers ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gpu_memory() -> ModuleType:
    return load_bench("gpu_memory.py")


def test_zero_shardable_bytes_by_stage(gpu_memory: ModuleType) -> None:
    shard = gpu_memory.zero_shardable_bytes
    assert shard(1000, 1500, 0) == {}
    assert sum(shard(1000, 1500, 1).values()) == 1000 * (4 + 8)  # fp32 master + Adam moments
    assert sum(shard(1000, 1500, 2).values()) == 1000 * (4 + 8 + 4)  # + gradients
    assert sum(shard(1000, 1500, 3).values()) == 1000 * 16 + 1500 * 4  # + every engine weight
    for bad in ((1000, 1500, 4), (2000, 1500, 2), (-1, 1500, 1)):
        with pytest.raises(ValueError):
            shard(*bad)


def test_per_gpu_estimate(gpu_memory: ModuleType) -> None:
    estimate = gpu_memory.per_gpu_estimate
    assert estimate(100 * GIB, 64 * GIB, 8, 28 * GIB) == (100 - 64 + 8 + 28) * GIB
    assert estimate(100 * GIB, 64 * GIB, 1) == 100 * GIB  # one rank shards nothing
    assert estimate(10, 3, 2) == 10 - 3 + 2  # a share is rounded up, never down
    for bad in ((100, 64, 0), (100, 101, 8), (100, -1, 8)):
        with pytest.raises(ValueError):
            estimate(*bad)


def test_server_share_bytes(gpu_memory: ModuleType) -> None:
    share = gpu_memory.server_share_bytes
    assert share("sglang", 0.35, 80) == int(0.35 * 80 * GIB)
    assert share("sglang", None, 80) == 0
    assert share("hf", 0.35, 80) == 0


def test_arch_configs_have_the_published_sizes(gpu_memory: ModuleType, tiny_dir: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    published = {"qwen2.5-3b": (3_085_938_688, "Qwen2ForCausalLM"),
                 "qwen2.5-7b": (7_615_616_512, "Qwen2ForCausalLM"),
                 "smollm2-135m": (134_515_008, "LlamaForCausalLM")}
    for name, (params, cls) in published.items():
        with torch.device("meta"):  # no memory: shapes only
            model = AutoModelForCausalLM.from_config(gpu_memory.arch_config(name, tokenizer))
        assert type(model).__name__ == cls
        assert sum(p.numel() for p in model.parameters()) == params, name


def test_synthetic_rows_never_cut_an_episode(gpu_memory: ModuleType) -> None:
    from longturn.algo.turn_grid import TurnGrid

    rows = gpu_memory.synthetic_rows(12, 8, prompt_tokens=20, shared_prefix=15,
                                     response_tokens=3, vocab=50, seed=1)
    assert len(rows) == 12 and {r["env_index"] for r in rows} == {0, 1, 2, 3}  # gcd(12, 8)
    prefix = rows[0]["prompt_ids"][:15]
    assert all(r["prompt_ids"][:15] == prefix and len(r["prompt_ids"]) == 20 for r in rows)
    assert len({tuple(r["prompt_ids"]) for r in rows}) == 12
    assert all(0 <= t < 50 for r in rows for t in r["prompt_ids"] + r["response_ids"])
    grid = TurnGrid.build(*([r[k] for r in rows] for k in ("env_index", "step", "episode_id",
                                                            "iteration")))
    for row, succ in zip(rows, grid.next_row):
        assert succ >= 0 or (row["segment_end"] and row["bootstrap_prompt_ids"])


def test_generated_count_and_batches() -> None:
    engine = load_bench("engine_throughput.py")
    assert engine.generated_count([5, 7, 2, 9, 2], {2}, 5) == 3  # up to and including the stop
    assert engine.generated_count([5, 7, 9], {2}, 3) == 3  # no stop: the limit
    assert engine.generated_count([2, 0, 0], {2}, 3) == 1
    assert engine.generated_count([5, 7, 9, 2], {2}, 2) == 2  # a stop past the limit is ignored
    assert engine.parse_batches("64,512") == [64, 512]
    for bad in ("", "0,4", "a,4"):
        with pytest.raises(ValueError):
            engine.parse_batches(bad)


def test_ppo_update_variants() -> None:
    ppo = load_bench("ppo_update.py")
    from trainer_settings import make_settings

    params_yaml = make_settings(lora=True, lora_layers=8, share_prefix=True, share_trunk=True)
    names = list(ppo.variants(params_yaml, 8, layers=30))
    assert names[0] == "plain" and "shared prefix" in names
    assert "shared prefix + LoRA top 8, trunk on (= params.yaml)" in names
    assert ppo.trunk_pairs(names) == [
        ("LoRA top 8", "LoRA top 8, trunk off", "LoRA top 8, trunk on"),
        ("shared prefix + LoRA top 8", "shared prefix + LoRA top 8, trunk off",
         "shared prefix + LoRA top 8, trunk on (= params.yaml)")]
    # on a 2-layer model, LoRA on the top 8 layers is LoRA everywhere: the shared-prefix run
    assert "shared prefix (= params.yaml)" in ppo.variants(params_yaml, 1, layers=2)
    full = make_settings(lora=False, share_prefix=True)
    assert list(ppo.variants(full, 8, layers=30)) == ["plain", "shared prefix (= params.yaml)"]
