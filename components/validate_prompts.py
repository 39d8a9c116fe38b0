"""Stage validate_prompts: budget-check prompts, sample answers, gate on the valid-action ratio
(protocol chat: play whole episodes, gate on the budget and the share of replies whose tool
calls ran).

Below the gate it writes its report, leaves out the `passed` marker that critic_warmup and train
depend on, and exits 2 with one line naming each failing task (as every user error does).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

if not __package__:  # run as a file: one line when this Python lacks longturn
    import python_check  # noqa: F401

from components.common import parser, run
from longturn.run.preflight import preflight
from longturn.atomic import write_json, write_text
from longturn.engines.registry import make_engine, sampling_from_params
from longturn.run.models import check_model_dir, load_tokenizer
from longturn.rollout.sample_metrics import json_safe, sample_metrics
from longturn.run.headline import SUMMARY_FILE, validation_summary
from longturn.run.protocol import protocol
from longturn.run.validation import PASSED_MARKER, PASSED_TEXT, GateFailed
from longturn.trajectories import write_samples

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
    checks = protocol(params).validation
    try:
        results = checks.play(engine, tokenizer, params, sampling, seeds)
    finally:
        engine.close()
    for r in results:
        log.info("%s: valid action ratio %.2f", r.task, r.metrics["valid_action_ratio"])
    gate = v.min_valid_action_ratio
    failures = checks.gate_failures(results, gate)
    meta = {"sampling": sampling.__dict__}
    samples = [s for r in results for s in r.samples]
    write_samples(samples, out / "samples.parquet", meta)
    write_json(out / SUMMARY_FILE, validation_summary(not failures, sample_metrics(samples)))
    metrics = {"tasks": {r.task: json_safe(r.metrics) for r in results}, "passed": not failures,
               "min_valid_action_ratio": gate}
    write_json(out / "metrics.json", metrics)
    settings = {"model": params.model.source, "samples_per_task": v.samples_per_task,
                **{k: getattr(sampling, k) for k in ("temperature", "top_p", "top_k", "max_new_tokens")}}
    write_text(out / "report.md",
               checks.render_report(results, failures, gate, settings, tokenizer))
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
