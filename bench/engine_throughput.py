"""Generated tokens per second: the in-process HFEngine against transformers' model.generate().

Why: HFEngine runs its own decode loop (static KV buffers, the shared prompt prefix attended to
once, batched counter-based sampling, CUDA graphs on a GPU) instead of `model.generate()`. This
says what that buys on the prompts the collector really sends, at the batch sizes a rollout uses.
READ THE RATIO engine / generate(): both run in the same process, on the same prompts, weights,
dtype and device, one after the other; absolute tokens/s vary from run to run and machine to
machine (and on a shared CPU with the neighbours' load).

Prompts: --prompts distinct turn-0 prompts of the params file's env (BabyAI: ~600 tokens with the
SmolLM2 tokenizer, ~510 of them shared), built by the collector's own env slots on different env
seeds (bench/agent_prompts.py), cycled to fill each batch size of --batches. Every system samples
--new-tokens at most at --temperature, no top-k / top-p: the engine with SamplingParams(seed),
generate() with left padding, do_sample=True, top_k=0, top_p=1.0, torch.manual_seed, and the
engine's `stop_ids` as its eos ids. Generated tokens are counted the same way for both: up to and
including the first stop token, else --new-tokens. The engine is also timed with fast_path=False
(its generic loop on the model's forward + DynamicCache) as a second reference line. Before the
timed calls, each system runs one untimed call on the same batch (on CUDA the first call of a
shape captures the step graph); --repeats timed calls follow, the median is printed.

--tiny: the tiny random model (bench/tiny_model.py), batches 2 and 4, 2 prompts, 8 new tokens: a
smoke run in seconds whose ratio means little.

    .venv/bin/python bench/engine_throughput.py [--batches 64,512] [--new-tokens 48]
        [--temperature 0.7] [--dtype bfloat16] [--device auto] [--model-dir DIR]
        [--tiny [--tiny-dir DIR]] [--json FILE]

--json FILE also writes every figure printed (tokens/s, tokens per prompt, ratios per batch
size) as JSON, for bench/gpu_campaign.py's results.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_prompts import collector_prompts, cycled  # noqa: E402
from longturn.params.config import load_params  # noqa: E402
from longturn.device import resolve_device  # noqa: E402
from longturn.engines.base import SamplingParams  # noqa: E402
from longturn.engines.hf import HFEngine  # noqa: E402
from longturn.engines.prefix import left_pad  # noqa: E402
from longturn.engines.shared_prefix import shared_prefix_length  # noqa: E402
from cpu_threads import add_threads_arg, use_threads  # noqa: E402
from tiny_model import add_tiny_args, fill_defaults, resolve_model_dir  # noqa: E402

FULL = {"batches": "64,512", "new_tokens": 48, "prompts": 32}
TINY = {"batches": "2,4", "new_tokens": 8, "prompts": 2}
Generator = Callable[[list[list[int]]], list[list[int]]]


def parse_batches(text: str) -> list[int]:
    """'64,512' -> [64, 512]; every size must be a positive integer."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--batches must be comma-separated integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--batches needs positive batch sizes, got {text!r}")
    return sizes


def generated_count(token_ids: Sequence[int], stop_ids: set[int], limit: int) -> int:
    """Tokens a completion generated: up to and including its first stop token, else `limit`
    (what follows a stop in generate()'s output is padding, not work asked for)."""
    for index, token in enumerate(token_ids[:limit]):
        if token in stop_ids:
            return index + 1
    return min(len(token_ids), limit)


def engine_generator(engine: HFEngine, sampling: SamplingParams) -> Generator:
    """The engine as prompts -> generated token ids."""
    return lambda prompts: [c.token_ids for c in engine.generate(prompts, sampling)]


def hf_generator(model: torch.nn.Module, stop_ids: set[int], pad_id: int,
                 args: argparse.Namespace) -> Generator:
    """transformers' model.generate() as prompts -> generated token ids (left padded, seeded,
    no top-k / top-p, stopping on the engine's stop ids)."""
    from transformers import GenerationConfig

    sample = args.temperature > 0
    config = GenerationConfig(do_sample=sample, temperature=args.temperature if sample else None,
                              top_k=0, top_p=1.0, max_new_tokens=args.new_tokens,
                              eos_token_id=sorted(stop_ids), pad_token_id=pad_id)
    device = next(model.parameters()).device

    def generate(prompts: list[list[int]]) -> list[list[int]]:
        ids, mask = left_pad(prompts, pad_id, device)
        torch.manual_seed(args.seed)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        return out[:, ids.shape[1]:].tolist()

    return generate


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def tokens_per_second(generate: Generator, prompts: list[list[int]], stop_ids: set[int],
                      args: argparse.Namespace, device: torch.device) -> tuple[float, float]:
    """(median tokens/s over --repeats timed calls after one untimed call, mean generated
    tokens per prompt)."""
    generate(prompts)  # warm-up: allocations, kernel choice, CUDA graph capture
    rates, counts = [], []
    for _ in range(args.repeats):
        synchronize(device)
        start = time.perf_counter()
        outputs = generate(prompts)
        synchronize(device)
        seconds = time.perf_counter() - start
        tokens = sum(generated_count(ids, stop_ids, args.new_tokens) for ids in outputs)
        rates.append(tokens / seconds)
        counts.append(tokens / len(prompts))
    return statistics.median(rates), statistics.mean(counts)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default=str(ROOT / "params.yaml"),
                    help="env and prompt settings the prompts are built with")
    ap.add_argument("--model-dir", default=str(ROOT / "data/models/base"))
    ap.add_argument("--batches", default=None, help="batch sizes (default 64,512; --tiny 2,4)")
    ap.add_argument("--new-tokens", type=int, default=None, help="default 48 (--tiny 8)")
    ap.add_argument("--prompts", type=int, default=None,
                    help="distinct prompts, cycled to fill a batch (default 32; --tiny 2)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--repeats", type=int, default=1, help="timed calls per system and batch")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed of every call")
    add_threads_arg(ap)
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    add_tiny_args(ap)
    args = fill_defaults(ap.parse_args(), FULL, TINY)
    try:
        args.batches = parse_batches(args.batches)
    except ValueError as err:
        ap.error(str(err))
    if args.new_tokens < 1 or args.prompts < 1 or args.repeats < 1 or args.temperature < 0:
        ap.error("--new-tokens, --prompts and --repeats must be >= 1, --temperature >= 0")
    return args


def run(args: argparse.Namespace, model_dir: str) -> dict:
    device = resolve_device(args.device)
    use_threads(args.threads)
    engine = HFEngine(model_dir, dtype=args.dtype, device=device)
    generic = HFEngine(model_dir, dtype=args.dtype, device=device, fast_path=False)
    stops = set(engine.stop_ids)
    prompts = collector_prompts(load_params(args.params), engine.tokenizer, args.prompts)
    sampling = SamplingParams(max_new_tokens=args.new_tokens, temperature=args.temperature,
                              top_p=1.0, top_k=0, seed=args.seed)
    systems = {f"engine ({engine.decoder_name})": engine_generator(engine, sampling),
               f"engine ({generic.decoder_name})": engine_generator(generic, sampling),
               "generate()": hf_generator(engine.model, stops, engine.pad_id, args)}
    lengths = [len(p) for p in prompts]
    print(f"{len(prompts)} distinct prompts of {min(lengths)}-{max(lengths)} tokens (shared "
          f"prefix {shared_prefix_length(prompts)}), cycled to each batch; up to "
          f"{args.new_tokens} new tokens at temperature {args.temperature}; {args.dtype} on "
          f"{device}{'' if device.type == 'cuda' else f', torch threads={torch.get_num_threads()}'}"
          f"; median of {args.repeats} timed call(s) after 1 untimed")
    if engine.decoder_name != "static":
        print("  note: this model has no fast path: the engine line is its generic loop too")
    figures = {"device": str(device), "dtype": args.dtype, "new_tokens": args.new_tokens,
               "temperature": args.temperature, "prompt_tokens": [min(lengths), max(lengths)],
               "batches": {}}
    for size in args.batches:
        batch = cycled(prompts, size)
        rates = {name: tokens_per_second(fn, batch, stops, args, device)
                 for name, fn in systems.items()}
        report_batch(size, rates)
        engine, generic, reference = (rate for rate, _ in rates.values())
        figures["batches"][str(size)] = {
            "tokens_per_s": {name: rate for name, (rate, _) in rates.items()},
            "tokens_per_prompt": {name: mean for name, (_, mean) in rates.items()},
            "engine_vs_generate": engine / reference, "generic_vs_generate": generic / reference}
    return figures


def report_batch(size: int, rates: dict[str, tuple[float, float]]) -> None:
    """One batch size: tokens/s and mean tokens per prompt of each system, then the ratios."""
    print(f"  batch {size}:")
    for name, (rate, mean_tokens) in rates.items():
        print(f"    {name:18s}: {rate:10.1f} tok/s   ({mean_tokens:5.1f} tokens per prompt)")
    engine, generic, reference = (rate for rate, _ in rates.values())
    print(f"    ratio engine / generate(): {engine / reference:6.2f}x   (generic loop / "
          f"generate(): {generic / reference:.2f}x)")


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        figures = run(args, resolve_model_dir(args, tmp))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
