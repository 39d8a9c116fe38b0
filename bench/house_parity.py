"""Before/after parity for issue 22: the old code and the new run the same cases on the same
seeds at toy size, and their iteration-0 trajectories and trained actors must match.

Why: the refactor replaces the rollout, the Parquet schema and scoring. Each side runs only the
stage command lines (prepare_model, critic_warmup where there is a critic, train: 1 iteration)
in its own tree, so the tool holds whatever the library's layout becomes. Compared per case:
the trajectory file as schema-neutral records (token ids equal; advantages and returns within
1e-6), the row count and episode ids, and every tensor of `<out>/final` (within 1e-5).
Cases: a default (window, THINK/ACTION, GAE), b tools (whole episode, tools, interaction),
c gigpo (GiGPO on the default), d vision (frames in a conversation).

    .venv/bin/python bench/house_parity.py --tiny                  # baseline vs this tree
    .venv/bin/python bench/house_parity.py --tiny --old HEAD --new HEAD --cases a,c

Exit 0: every case matches; 1: a difference (the first one is named); 2: it could not compare.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))  # parity/, tiny_model.py: run from a checkout

from parity import ParityError  # noqa: E402
from parity.cases import Case, pick  # noqa: E402
from parity.compare import compare_records, compare_weights  # noqa: E402
from parity.normalize import normalise  # noqa: E402
from parity.runs import run_case  # noqa: E402
from parity.trees import Tree, check_imports_inside, extract  # noqa: E402
from tiny_model import (TinyModelError, add_tiny_args, build_tiny_llava,  # noqa: E402
                        ensure_tiny_model)

BASELINE = "cb58f25ee10a985d2fc7d5fc1d1a37dbf2f67556"  # the last commit before issue 22's refactor
HEADER = (f"{'case':<12} {'rows':>9} {'ids':>6} {'max|Δadv|':>10} {'max|Δret|':>10} "
          f"{'max|Δw|':>10} {'s':>5}  verdict")


def model_sources(cases: list[Case], args: argparse.Namespace, work: Path) -> dict[str, str | None]:
    """Case letter → model.source: the tiny Llama / tiny LLaVA under --tiny, else the profile's
    own model (None) and --vision-model for the vision case."""
    out: dict[str, str | None] = {}
    text = vision = None
    if args.tiny:
        text = ensure_tiny_model(Path(args.tiny_dir or work / "tiny_model"))
        if any(c.vision for c in cases):
            vision = str(tiny_llava(text, work / "tiny_llava"))
    elif any(c.vision for c in cases):
        if not args.vision_model:
            raise ParityError("case d (vision) needs --vision-model DIR, a LLaVA Hugging Face "
                              "dir (or use --tiny)")
        if not (Path(args.vision_model) / "config.json").is_file():
            raise ParityError(f"--vision-model {args.vision_model}: no config.json there")
        vision = str(Path(args.vision_model).resolve())
    for case in cases:
        out[case.letter] = vision if case.vision else text
    return out


def tiny_llava(tokenizer_dir: str, out: Path) -> Path:
    """The tests' tiny random LLaVA (bench/tiny_model.py; built from configs, no download)."""
    return out if (out / "config.json").is_file() else build_tiny_llava(tokenizer_dir, out)


def compare_case(case: Case, trees: tuple[Tree, Tree], source: str | None, work: Path,
                 tiny: bool) -> str | None:
    """Run both sides, print the case's row; the first difference, or None. At toy size the two
    sides run side by side (a tiny stage is mostly one core's start-up); at full size one after
    the other, since each stage uses every core. Neither changes what a side computes: torch's
    CPU kernels split work by thread count, not by load."""
    start = time.monotonic()

    def side(tree: Tree):
        return run_case(tree, case, work / "runs" / tree.label / case.name, source, tiny)

    with ThreadPoolExecutor(2 if tiny else 1) as pool:
        old, new = pool.map(side, trees)
    records = compare_records(normalise(old.trajectories), normalise(new.trajectories))
    weights = compare_weights(old.final, new.final)
    first = records.first or weights.first
    rows = f"{records.rows_compared}/{max(records.rows_old, records.rows_new)}"
    print(f"{case.letter} {case.name:<10} {rows:>9} {'equal' if records.ids_equal else 'DIFF':>6} "
          f"{records.max_advantages:>10.2e} {records.max_returns:>10.2e} {weights.max_diff:>10.2e} "
          f"{time.monotonic() - start:>5.0f}  {'same' if first is None else 'DIFFERENT'}",
          flush=True)
    return None if first is None else f"case {case.letter} ({case.name}): {first}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default=BASELINE, help="revision of the old code (default: "
                        f"{BASELINE[:7]}, the baseline)")
    parser.add_argument("--new", default=None,
                        help="revision of the new code (default: this working tree, as it is)")
    parser.add_argument("--cases", default="a,b,c,d", help="letters of the cases (default: all)")
    parser.add_argument("--keep", default=None, help="run in this dir and keep it (default: a "
                        "temp dir, removed)")
    parser.add_argument("--vision-model", default=None,
                        help="without --tiny: the LLaVA HF dir of the vision case")
    add_tiny_args(parser)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="house_parity-") as tmp:
        work = Path(args.keep).resolve() if args.keep else Path(tmp)
        try:
            cases = pick(args.cases)
            if args.keep and work.is_dir() and any(work.iterdir()):
                raise ParityError(f"--keep {args.keep}: not empty; name a new dir")
            old = extract(ROOT, args.old, work / "trees" / "old", "old")
            new = (extract(ROOT, args.new, work / "trees" / "new", "new") if args.new
                   else Tree("new", ROOT, "working tree"))
            for tree in (old, new):
                check_imports_inside(tree)
                print(f"{tree.label}: {tree.rev} at {tree.root}")
            sources = model_sources(cases, args, work)
            print(HEADER, flush=True)
            firsts = [compare_case(c, (old, new), sources[c.letter], work, args.tiny)
                      for c in cases]
        except (ParityError, TinyModelError) as err:
            print(f"house_parity: error: {err}", file=sys.stderr)
            return 2
        if args.keep:
            print(f"runs kept in {work}")
    differences = [f for f in firsts if f]
    if differences:
        print(f"house_parity: first difference: {differences[0]}", file=sys.stderr)
        return 1
    print(f"parity: {len(cases)} case(s) the same")
    return 0


if __name__ == "__main__":
    sys.exit(main())
