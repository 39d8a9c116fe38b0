"""Peak memory of the trainer's phases on ONE device, and what that means per GPU at N ranks.

Why: a GPU profile (configs/profiles/gpu.yaml: Qwen2.5-3B, full fine-tuning, ZeRO-2 on 8 GPUs next to an
SGLang server) must fit each GPU before anyone books 8 of them. This measures the trainer on one
device and turns the measurement into a per-GPU estimate with arithmetic anyone can check.

How: a model of --arch is built from its config alone (random weights, nothing downloaded) and
saved in bf16 with the SmolLM2 tokenizer into a temp dir (the synthetic token ids stay below the
tokenizer's size, which every arch's vocabulary exceeds or equals). With the params file's
trainer settings (command-line overrides: --micro-batch, --bf16, --gradient-checkpointing,
--zero-stage, --device) one PPOTrainer is built on one device: actor and critic in fp32 inside
their DeepSpeed engines, plus the frozen reference (a bf16 copy under bf16 for full fine-tuning;
none under LoRA, where it is the actor with adapters off). Then one mini-batch of synthetic turn
rows (ppo.mini_batch_size turns: rollout.n_envs slots × steps, the last step bootstrapped; prompts
of --prompt-tokens whose first --shared-prefix-tokens are common to all, as the real system prompt
and worked example are; responses of --response-tokens) is scored as samples of one reply,
written with write_samples and used for one update: one optimizer step of actor and critic. Printed: the peak of each phase
(load, score, update): on CUDA torch.cuda.max_memory_allocated after reset_peak_memory_stats;
on a CPU the process's peak resident set size (RSS, reset per phase through
/proc/self/clear_refs), which also counts the Python process and its libraries.

The estimate at --ranks N under the settings' ZeRO stage (pure arithmetic, `zero_shardable_bytes`
and `per_gpu_estimate`, tested): the measured single-device peak minus what ZeRO spreads over the
ranks, plus that part's 1/N share. From parameter counts: ZeRO-1 shards the optimizer states, i.e.
Adam's two fp32 moments (8 B per trainable parameter) and the fp32 master copy DeepSpeed keeps
beside the module weights (4 B; stage_1_and_2.py clones each partition even for fp32 weights);
ZeRO-2 also the gradients (4 B per trainable parameter); ZeRO-3 also the engines' weights (4 B per
parameter, trainable or not). The reference model lives outside DeepSpeed and is never sharded.
When engine.name is sglang, the server's static share (engine.sglang.mem_fraction_static ×
--gpu-gib) is added, and the total is compared with --gpu-gib. Activations, ZeRO buckets and
workspace stay as measured: per rank they do not shrink with N.

--tiny: the tiny random model (bench/tiny_model.py), 96-token prompts (64 shared), 8-token
responses: the whole path in seconds on a CPU, the numbers are a smoke test, not an estimate.

    .venv/bin/python bench/gpu_memory.py [--arch qwen2.5-3b] [--params configs/profiles/gpu.yaml]
        [--ranks 8] [--gpu-gib 80] [--micro-batch M] [--no-bf16] [--zero-stage S]
        [--tiny [--tiny-dir DIR]]
"""

from __future__ import annotations

import argparse
import math
import random
import re
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(ROOT / "tests"))  # the turn rows it builds its batch from

from agent_prompts import collector_prompts  # noqa: E402
from cpu_threads import add_threads_arg, use_threads  # noqa: E402
from longturn.algo.trainer import PPOTrainer, TrainerSettings  # noqa: E402
from longturn.params.config import Params  # noqa: E402
from longturn.params.profiles import load_profile  # noqa: E402
from longturn.device import resolve_device  # noqa: E402
from longturn.run.models import load_tokenizer  # noqa: E402
from longturn.engines.shared_prefix import shared_prefix_length  # noqa: E402
from longturn.run.wiring import gae_params, trainer_settings  # noqa: E402
from turn_rows import samples_from_turns  # noqa: E402
from longturn.trajectories import write_samples  # noqa: E402
from tiny_model import (TinyModelError, add_tiny_args, ensure_tiny_model,  # noqa: E402
                        fill_defaults, smollm2_tokenizer)

GIB = 1 << 30
BYTES_ADAM, BYTES_MASTER, BYTES_GRAD, BYTES_WEIGHT = 8, 4, 4, 4  # fp32, per parameter
FULL = {"arch": "qwen2.5-3b", "prompt_tokens": None, "response_tokens": None,
        "shared_prefix_tokens": None}
TINY = {"arch": "tiny", "prompt_tokens": 96, "response_tokens": 8, "shared_prefix_tokens": 64}

# Published configs (config.json on the Hugging Face hub) of the models the profiles name.
ARCHS: dict[str, dict[str, Any]] = {
    "qwen2.5-3b": dict(model_type="qwen2", vocab_size=151936, hidden_size=2048,
                       intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                       num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1e6,
                       max_position_embeddings=32768, rms_norm_eps=1e-6, hidden_act="silu"),
    "qwen2.5-7b": dict(model_type="qwen2", vocab_size=152064, hidden_size=3584,
                       intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, tie_word_embeddings=False, rope_theta=1e6,
                       max_position_embeddings=32768, rms_norm_eps=1e-6, hidden_act="silu"),
    "smollm2-135m": dict(model_type="llama", vocab_size=49152, hidden_size=576,
                         intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, tie_word_embeddings=True, rope_theta=1e5,
                         max_position_embeddings=8192, rms_norm_eps=1e-5, hidden_act="silu"),
}
ARCH_CHOICES = (*ARCHS, "tiny")


# ---- the arithmetic (pure) ---------------------------------------------------------------

def zero_shardable_bytes(trainable: int, engine_params: int, stage: int) -> dict[str, int]:
    """Bytes of one rank's training state that ZeRO `stage` spreads over the ranks (at one rank
    all of it sits on the device), by part: 0 shards nothing, 1 the optimizer states (fp32 master
    copy + Adam moments of the trainable parameters), 2 also their gradients, 3 also the weights
    of every parameter in the engines."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0-3, got {stage}")
    if trainable < 0 or engine_params < trainable:
        raise ValueError(f"need 0 <= trainable ({trainable}) <= engine_params ({engine_params})")
    parts: dict[str, int] = {}
    if stage >= 1:
        parts["optimizer states (fp32 master + Adam)"] = trainable * (BYTES_MASTER + BYTES_ADAM)
    if stage >= 2:
        parts["gradients"] = trainable * BYTES_GRAD
    if stage >= 3:
        parts["weights"] = engine_params * BYTES_WEIGHT
    return parts


def per_gpu_estimate(single_peak: int, shardable: int, ranks: int, server: int = 0) -> int:
    """Bytes per GPU at `ranks` ranks: the single-device peak with its shardable part replaced by
    that part's 1/ranks share, plus what the inference server reserves on the same GPU."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    if not 0 <= shardable <= single_peak:
        raise ValueError(f"shardable bytes ({shardable}) must lie within the measured peak "
                         f"({single_peak})")
    return single_peak - shardable + math.ceil(shardable / ranks) + server


def server_share_bytes(engine_name: str, mem_fraction: float | None, gpu_gib: float) -> int:
    """The SGLang server's static reservation on a GPU of gpu_gib GiB (0 for in-process engines,
    and for an unset fraction, which SGLang picks itself at start-up)."""
    if engine_name != "sglang" or mem_fraction is None:
        return 0
    return int(mem_fraction * gpu_gib * GIB)


# ---- the model ---------------------------------------------------------------------------

def arch_config(name: str, tokenizer: Any, layers: int | None = None) -> Any:
    """The transformers config of a published arch, with the tokenizer's special ids, cut to
    `layers` decoder layers when given; refuses a vocabulary the tokenizer's ids would overflow."""
    from transformers import AutoConfig

    if name not in ARCHS:
        raise ValueError(f"unknown arch {name!r}: one of {', '.join(ARCHS)}")
    spec = dict(ARCHS[name])
    if spec["vocab_size"] < len(tokenizer):
        raise ValueError(f"{name}: vocabulary {spec['vocab_size']} is smaller than the "
                         f"tokenizer's {len(tokenizer)}")
    if layers is not None:
        spec["num_hidden_layers"] = layers
    return AutoConfig.for_model(spec.pop("model_type"), bos_token_id=tokenizer.bos_token_id,
                                eos_token_id=tokenizer.eos_token_id,
                                pad_token_id=tokenizer.pad_token_id, **spec)


def build_random_model(name: str, out: Path, layers: int | None = None) -> str:
    """A random-weight model of arch `name` (`layers` deep when given) saved in bf16 with the
    SmolLM2 tokenizer (the tiny arch: the tiny model of bench/tiny_model.py)."""
    from transformers import AutoModelForCausalLM

    if name == "tiny":
        return ensure_tiny_model(out)
    tokenizer = smollm2_tokenizer()
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # half the host memory of an fp32 init
    try:
        model = AutoModelForCausalLM.from_config(arch_config(name, tokenizer, layers))
    finally:
        torch.set_default_dtype(default)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model
    return str(out)


# ---- the rows ----------------------------------------------------------------------------

def synthetic_rows(n_rows: int, n_envs: int, prompt_tokens: int, shared_prefix: int,
                   response_tokens: int, vocab: int, seed: int = 0) -> list[dict[str, Any]]:
    """`n_rows` turn rows as the collector orders them (step-major over gcd(n_rows, n_envs)
    slots): each prompt is the same `shared_prefix` ids then distinct random ids; the last step
    ends the segment and carries a bootstrap prompt, so no episode is cut."""
    if not 0 <= shared_prefix < prompt_tokens or response_tokens < 1 or n_rows < 1:
        raise ValueError("need 0 <= shared prefix < prompt tokens, >= 1 response token and row")
    rng = random.Random(seed)
    envs = math.gcd(n_rows, max(1, n_envs))
    steps = n_rows // envs
    prefix = [rng.randrange(vocab) for _ in range(shared_prefix)]

    def prompt() -> list[int]:
        return prefix + [rng.randrange(vocab) for _ in range(prompt_tokens - shared_prefix)]

    rows = []
    for step in range(steps):
        for env in range(envs):
            last = step == steps - 1
            rows.append(dict(
                run_id="gpu-memory", policy_version="random", iteration=0, env_index=env,
                env_name="synthetic", task="synthetic", episode_id=f"synthetic-{env}",
                episode_seed=env, turn=step, step=step, prompt_ids=prompt(),
                response_ids=[rng.randrange(vocab) for _ in range(response_tokens)],
                prompt_text="", response_text="", raw_action="", action="", action_valid=True,
                env_reward=0.0, reward=rng.choice((0.0, 0.0, 0.0, 1.0)), terminated=False,
                truncated=False, success=False, segment_end=last, aborted=False,
                finish_reason="length", history_dropped=0,
                bootstrap_prompt_ids=prompt() if last else None))
    return rows


# ---- measuring ---------------------------------------------------------------------------

def _rss_high_water() -> int | None:
    """This process's peak RSS in bytes since the last reset (VmHWM), or None off Linux."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    match = re.search(r"VmHWM:\s+(\d+) kB", status)
    return int(match.group(1)) * 1024 if match else None


class PeakMeter:
    """Peak memory since `reset()`: CUDA allocations on a GPU, resident set size on a CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.per_phase = True
        if device.type == "cuda":
            self.what = "torch.cuda.max_memory_allocated (GPU memory)"
        else:
            self.what = "peak RSS of this process (host memory, Python and libraries included)"

    def reset(self) -> None:
        """Start a phase: the peak drops to what is held now."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")  # 5: reset the RSS high-water mark
        except OSError:
            self.per_phase = False

    def peak(self) -> int:
        """Bytes at the highest point since reset() (lifetime peak where reset is impossible)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device)
        high = _rss_high_water() if self.per_phase else None
        if high is None:  # ru_maxrss: KiB on Linux, the process's lifetime peak
            self.per_phase = False
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return high

    def reserved(self) -> int | None:
        """Peak bytes the CUDA caching allocator held (allocations plus its slack)."""
        if self.device.type != "cuda":
            return None
        return torch.cuda.max_memory_reserved(self.device)


@dataclass(frozen=True)
class Phase:
    """One measured phase: its peak bytes, wall seconds and (CUDA) the allocator's peak."""

    name: str
    peak: int
    seconds: float
    reserved: int | None


def run_phase(meter: PeakMeter, name: str, fn: Callable[[], Any]) -> tuple[Any, Phase]:
    """Run one phase between a peak reset and a peak read; an out-of-memory error ends the
    bench with a message naming the phase."""
    meter.reset()
    start = time.perf_counter()
    try:
        result = fn()
    except torch.OutOfMemoryError as err:
        sys.exit(f"phase {name!r} ran out of memory on one {meter.device} device ({err}). The "
                 "measurement holds one rank's whole unsharded state: try a smaller --arch, "
                 "--micro-batch 1, --gradient-checkpointing, or a larger device")
    return result, Phase(name, meter.peak(), time.perf_counter() - start, meter.reserved())


def count(params: Any) -> int:
    """Elements of parameters, whole even when ZeRO-3 has partitioned them (ds_numel)."""
    return sum(int(getattr(p, "ds_numel", p.numel())) for p in params)


@dataclass(frozen=True)
class Counts:
    """Parameter counts the ZeRO arithmetic and the report need."""

    actor: int  # parameters of the actor (LoRA adapters included)
    trainable: int  # actor + critic parameters the optimizers step
    engine_params: int  # every parameter inside the two DeepSpeed engines
    reference: int  # parameters of the separate frozen reference (0 under LoRA)
    reference_bytes: int


def parameter_counts(trainer: PPOTrainer) -> Counts:
    """Counts from the live trainer, so LoRA, tied heads and the value head are as built."""
    modules = (trainer.actor_module, trainer.critic_module)
    trainable = sum(count(p for p in m.parameters() if p.requires_grad) for m in modules)
    total = sum(count(m.parameters()) for m in modules)
    ref = trainer.models.ref
    ref_params = list(ref.parameters()) if ref is not None else []
    ref_bytes = sum(p.numel() * p.element_size() for p in ref_params)
    return Counts(count(trainer.actor_module.parameters()), trainable, total, count(ref_params),
                  ref_bytes)


# ---- the run -----------------------------------------------------------------------------

def settings_from(params: Params, args: argparse.Namespace) -> TrainerSettings:
    """The params file's trainer settings with the command line's overrides."""
    s = trainer_settings(params)
    overrides = {"micro_batch_size": args.micro_batch, "bf16": args.bf16,
                 "gradient_checkpointing": args.gradient_checkpointing,
                 "zero_stage": args.zero_stage, "device": args.device}
    try:
        return replace(s, **{k: v for k, v in overrides.items() if v is not None})
    except ValueError as err:
        sys.exit(f"settings: {err}")


def row_shape(params: Params, args: argparse.Namespace, tokenizer: Any) -> tuple[int, int, int]:
    """(prompt tokens, shared prefix tokens, response tokens): the command line's, else the
    params file's caps (prompt.max_prompt_tokens, engine.sampling.max_new_tokens) and the
    shared prefix of the collector's real prompts."""
    prompt = args.prompt_tokens or params.prompt.max_prompt_tokens
    response = args.response_tokens or params.engine.sampling.max_new_tokens
    shared = args.shared_prefix_tokens
    if shared is None:
        shared = shared_prefix_length(collector_prompts(params, tokenizer, 4))
    return prompt, min(shared, prompt - 1), response


def measure(args: argparse.Namespace, model_dir: str, tmp: str) -> None:
    params = load_profile(args.params)  # a profile, or a whole params file
    settings = settings_from(params, args)
    tokenizer = load_tokenizer(model_dir)
    prompt, shared, response = row_shape(params, args, tokenizer)
    vocab = min(len(tokenizer), _vocab_size(model_dir))
    rows = synthetic_rows(settings.mini_batch_size, params.rollout.n_envs, prompt, shared,
                          response, vocab, seed=params.seed)
    meter = PeakMeter(resolve_device(settings.device))

    def load() -> PPOTrainer:
        return PPOTrainer(model_dir, model_dir, settings, gae_params(params), tokenizer)

    trainer, loaded = run_phase(meter, "load", load)
    samples = samples_from_turns(rows)
    scored, scoring = run_phase(meter, "score", lambda: trainer.score(samples))
    path = write_samples(scored, Path(tmp) / "samples.parquet")
    _, updating = run_phase(meter, "update", lambda: trainer.update([str(path)]))
    counts = parameter_counts(trainer)
    report(args, params, settings, rows, (prompt, shared, response), meter,
           [loaded, scoring, updating], counts, trainer)


def _vocab_size(model_dir: str) -> int:
    """The model's vocabulary: token ids must stay below it and below the tokenizer's."""
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(model_dir).vocab_size)


def gib(n: float) -> str:
    """Bytes as a right-aligned GiB figure."""
    return f"{n / GIB:8.2f} GiB"


def report(args, params, settings, rows, shape, meter, phases, counts, trainer) -> None:
    """Phase peaks, parameter counts and the per-GPU estimate."""
    prompt, shared, response = shape
    layers = len(trainer.models.actor_decoder.layers) if trainer.models.actor_decoder else "?"
    print(f"arch {args.arch} (actor {counts.actor / 1e6:.1f} M parameters, "
          f"{layers} layers) with the settings of {Path(args.params).name}: lora={settings.lora} "
          f"bf16={settings.bf16} zero_stage={settings.zero_stage} mini={settings.mini_batch_size}"
          f" micro={settings.micro_batch_size} gradient_checkpointing="
          f"{settings.gradient_checkpointing} share_prefix={settings.share_prefix}, trunk depth "
          f"{trainer.models.depth}")
    print(f"  one mini-batch: {len(rows)} turns, prompt {prompt} tokens ({shared} shared) + "
          f"response {response} tokens, one device ({meter.device})")
    print(f"  peak memory per phase, {meter.what}"
          f"{'' if meter.per_phase else ' (could not reset per phase: lifetime peaks)'}:")
    for phase in phases:
        extra = f", reserved {phase.reserved / GIB:.2f} GiB" if phase.reserved is not None else ""
        print(f"    {phase.name:6s}: {gib(phase.peak)}   ({phase.seconds:6.1f} s{extra})")
    print(f"  parameters: {counts.trainable / 1e6:.1f} M trainable (actor + critic), "
          f"{counts.engine_params / 1e6:.1f} M in the DeepSpeed engines, reference "
          f"{counts.reference / 1e6:.1f} M ({gib(counts.reference_bytes).strip()}, not sharded)")
    print_estimate(args, params, settings, max(p.peak for p in phases), counts, meter.device)


def print_estimate(args, params, settings, peak: int, counts: Counts,
                   device: torch.device) -> None:
    """The ZeRO arithmetic on the measured peak, the server's share, and the verdict."""
    parts = zero_shardable_bytes(counts.trainable, counts.engine_params, settings.zero_stage)
    shardable = min(sum(parts.values()), peak)
    e = params.engine
    server = server_share_bytes(e.name, e.sglang.mem_fraction_static, args.gpu_gib)
    total = per_gpu_estimate(peak, shardable, args.ranks, server)
    print(f"  ZeRO-{settings.zero_stage} over {args.ranks} ranks spreads (at one rank):"
          f"{'' if parts else ' nothing'}")
    for name, size in parts.items():
        print(f"    {name:40s}: {gib(size)}")
    label = f"trainer per GPU at {args.ranks} ranks"
    print(f"  {label:30s}: {gib(total - server)}   (measured peak {gib(peak).strip()} - "
          f"{gib(shardable).strip()} + 1/{args.ranks} of it)")
    if e.name == "sglang":
        fraction = e.sglang.mem_fraction_static
        note = (f"mem_fraction_static {fraction} x {args.gpu_gib:g} GiB" if fraction is not None
                else "mem_fraction_static unset: SGLang picks it, not counted")
        print(f"  {'sglang server share':30s}: {gib(server)}   ({note})")
    verdict = "fits" if total <= args.gpu_gib * GIB else "does NOT fit"
    print(f"  {'estimate per GPU':30s}: {gib(total)} of {args.gpu_gib:g} GiB -> {verdict} "
          f"(margin {(args.gpu_gib * GIB - total) / GIB:.2f} GiB)")
    if device.type != "cuda":
        print("  (measured on a CPU: the peak is host RSS, so the estimate is only the shape of "
              "the GPU one)")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=ARCH_CHOICES, default=None,
                    help="model built from its config (default qwen2.5-3b; --tiny: tiny)")
    ap.add_argument("--layers", type=int, default=None,
                    help="decoder layers of the arch (default: all). Every state and activation "
                         "grows linearly with depth: two depths that fit one device give the "
                         "slope, and the full depth follows")
    ap.add_argument("--params", default=str(ROOT / "configs/profiles/gpu.yaml"),
                    help="a profile or a whole params file (default: the gpu profile)")
    ap.add_argument("--ranks", type=int, default=8, help="ranks (GPUs) ZeRO shards over")
    ap.add_argument("--gpu-gib", type=float, default=80.0, help="memory of one GPU")
    ap.add_argument("--prompt-tokens", type=int, default=None,
                    help="default prompt.max_prompt_tokens (the cap; --tiny 96)")
    ap.add_argument("--shared-prefix-tokens", type=int, default=None,
                    help="tokens all prompts share (default: that of the collector's prompts)")
    ap.add_argument("--response-tokens", type=int, default=None,
                    help="default engine.sampling.max_new_tokens (--tiny 8)")
    ap.add_argument("--micro-batch", type=int, default=None, help="ppo.micro_batch_size")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                    help="ppo.bf16")
    ap.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction,
                    default=None, help="ppo.gradient_checkpointing")
    ap.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), default=None,
                    help="ppo.zero_stage")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None,
                    help="engine.device")
    add_threads_arg(ap)
    add_tiny_args(ap)
    args = fill_defaults(ap.parse_args(), FULL, TINY)
    if args.ranks < 1 or args.gpu_gib <= 0:
        ap.error("--ranks must be >= 1 and --gpu-gib > 0")
    if args.layers is not None and (args.layers < 1 or args.arch == "tiny"):
        ap.error("--layers must be >= 1, and the tiny arch has its own depth")
    return args


def main() -> None:
    args = parse_args()
    use_threads(args.threads)  # the CPU side of a GPU run, and all of a --device cpu one
    with tempfile.TemporaryDirectory() as tmp:
        reuse = args.arch == "tiny" and args.tiny_dir
        target = Path(args.tiny_dir) if reuse else Path(tmp) / "model"
        try:
            model_dir = build_random_model(args.arch, target, args.layers)
        except TinyModelError as err:
            sys.exit(str(err))
        measure(args, model_dir, tmp)


if __name__ == "__main__":
    main()
