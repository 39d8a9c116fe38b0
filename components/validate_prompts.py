"""Stage validate_prompts: budget-check prompts, sample answers, gate on the valid-action ratio
(sequence mode: play whole episodes, gate on the budget and the valid-reply ratio).

Below the gate it writes its report, leaves out the `passed` marker that critic_warmup and train
depend on, and exits 2 with one line naming each failing task (as every user error does).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from components.common import parser, run
from longturn.run.preflight import preflight
from longturn.atomic import write_json, write_text
from longturn.engines.registry import make_engine, sampling_from_params
from longturn.envs.registry import make_env
from longturn.run.models import check_model_dir, load_tokenizer
from longturn.rollout.sequence_metrics import json_safe
from longturn.run.sequence_validation import (render_sequence_report, sequence_gate_failures,
                                         validate_sequence_tasks)
from longturn.trajectories import write_samples, write_table
from longturn.run.validation import (PASSED_MARKER, PASSED_TEXT, GateFailed, gate_failures,
                                 validate_task)
from longturn.run.validation_report import render_report

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
    sequence = params.rollout.mode == "sequence"
    results = []
    try:
        if sequence:
            results = validate_sequence_tasks(engine, tokenizer, params, sampling, seeds)
        for task in [] if sequence else params.eval.tasks:
            env = make_env(params.env.name, task, **params.env.kwargs)
            results.append(validate_task(engine, tokenizer, env, params, sampling, seeds))
            env.close()
    finally:
        engine.close()
    ratio = "valid_reply_ratio" if sequence else "valid_action_ratio"
    for r in results:
        log.info("%s: %s %.2f", r.task, ratio.replace("_", " "), r.metrics[ratio])
    gate = v.min_valid_action_ratio
    failures = (sequence_gate_failures if sequence else gate_failures)(results, gate)
    meta = {"sampling": sampling.__dict__}
    samples = [s for r in results for s in r.samples]
    if sequence:
        write_samples(samples, out / "samples.parquet", meta)
    else:
        write_table(samples, out / "samples.parquet", None, meta)
    metrics = {"tasks": {r.task: json_safe(r.metrics) for r in results}, "passed": not failures,
               "min_valid_action_ratio": gate}
    write_json(out / "metrics.json", metrics)
    settings = {"model": params.model.source, "samples_per_task": v.samples_per_task,
                **{k: getattr(sampling, k) for k in ("temperature", "top_p", "top_k", "max_new_tokens")}}
    report = (render_sequence_report(results, failures, gate, settings, tokenizer) if sequence
              else render_report(results, failures, gate, settings))
    write_text(out / "report.md", report)
    if failures:
        raise GateFailed(failures, out / "report.md")
    write_text(out / PASSED_MARKER, PASSED_TEXT)  # last: the gate holds only when all is written
    return 0


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--model-dir", default="data/models/base")
    p.add_argument("--out", default="data/validation")
    return run("validate_prompts", body, p, argv, checks=preflight)


if __name__ == "__main__":
    sys.exit(main())
