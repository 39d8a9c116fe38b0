"""Stage validate_prompts: budget-check prompts, sample answers, gate on the valid-action ratio.

Below the gate it exits 1 after writing its report, and without the `passed` marker that
critic_warmup and train depend on.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from components.common import parser, run
from longturn.atomic import write_json, write_text
from longturn.engines.registry import make_engine, sampling_from_params
from longturn.envs.registry import make_env
from longturn.models import check_model_dir, load_tokenizer
from longturn.trajectories import write_table
from longturn.validation import PASSED_MARKER, PASSED_TEXT, gate_failures, validate_task
from longturn.validation_report import render_report

log = logging.getLogger("validate_prompts")


def body(args, params) -> int:
    out = Path(args.out)
    (out / PASSED_MARKER).unlink(missing_ok=True)  # only a pass of this run may leave one
    check_model_dir(args.model_dir)
    v = params.validation
    seeds = [v.seed + i for i in range(v.samples_per_task)]
    sampling = sampling_from_params(params, seed=v.seed)
    tokenizer = load_tokenizer(args.model_dir)
    engine = make_engine(args.model_dir, params)
    results = []
    try:
        for task in params.eval.tasks:
            env = make_env(params.env.name, task, **params.env.kwargs)
            results.append(validate_task(engine, tokenizer, env, params, sampling, seeds))
            env.close()
            log.info("%s: valid-action ratio %.2f", task, results[-1].metrics["valid_action_ratio"])
    finally:
        engine.close()
    failures = gate_failures(results, v.min_valid_action_ratio)
    write_table([s for r in results for s in r.samples], out / "samples.parquet", None,
                {"sampling": sampling.__dict__})
    metrics = {"tasks": {r.task: r.metrics for r in results}, "passed": not failures,
               "min_valid_action_ratio": v.min_valid_action_ratio}
    write_json(out / "metrics.json", metrics)
    settings = {"model": params.model.source, "samples_per_task": v.samples_per_task,
                **{k: getattr(sampling, k) for k in ("temperature", "top_p", "top_k", "max_new_tokens")}}
    write_text(out / "report.md", render_report(results, failures, v.min_valid_action_ratio, settings))
    for failure in failures:
        print(f"validate_prompts: gate failed: {failure}", file=sys.stderr)
    if failures:
        return 1
    write_text(out / PASSED_MARKER, PASSED_TEXT)  # last: the gate holds only when all is written
    return 0


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--model-dir", default="data/models/base")
    p.add_argument("--out", default="data/validation")
    return run("validate_prompts", body, p, argv)


if __name__ == "__main__":
    sys.exit(main())
