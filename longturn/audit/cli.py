"""`longturn audit`: read a run's trajectory Parquet files without writing code.

Every subcommand takes a run dir (default `data/train`; an evaluation dir such as
`data/eval/final`, or `data/validation`, where it makes sense) and prints plain text, or JSON
with `--json`. A missing dir, a truncated or foreign Parquet file, or one of schema version 1 is
one line on stderr and exit status 2; `gae` and `diff` exit 1 when they find a mismatch.

Every subcommand reads samples of schema version 2 as one row per reply, so window samples (one
reply each) and packed whole episodes (all their replies in one sample) are audited alike.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from longturn.audit.output import Output
from longturn.audit.run_files import open_run
from longturn.errors import UserError

DEFAULT_RUN = "data/train"
RUN_HELP = (f"train output, trajectories dir, eval or validation dir, or one file (default: "
            f"{DEFAULT_RUN})")
EXAMPLES = """examples:
  longturn audit summary data/train
  longturn audit episodes data/train --success no --min-length 8 --iteration 3
  longturn audit show train-r0-e1-4 data/train --no-prompt
  longturn audit gae data/train
  longturn audit sql "SELECT iteration, action, count(*) FROM turns GROUP BY ALL ORDER BY 1"
  longturn audit sql "SELECT episode_id, len(replies) FROM samples WHERE messages IS NOT NULL"
  longturn audit plot data/train --out audit-plots
  longturn audit diff data/train ../other-clone/data/train"""


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="\n\n".join(__doc__.split("\n\n")[1:3]),
                                epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="machine-readable output")
    run = argparse.ArgumentParser(add_help=False)
    run.add_argument("run_dir", nargs="?", default=DEFAULT_RUN, metavar="RUN_DIR", help=RUN_HELP)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("summary", parents=[run, common],
                   help="iterations, turns (replies), samples, episodes, success, valid "
                        "actions, tool calls, termination reasons; per rank, per task and per "
                        "iteration")
    ep = sub.add_parser("episodes", parents=[run, common],
                        help="one row per episode (its replies, return, ending), filtered")
    ep.add_argument("--task", help="only this task")
    ep.add_argument("--success", choices=("yes", "no"), help="only successful (or other) episodes")
    ep.add_argument("--min-length", type=int, help="at least this many turns (replies)")
    ep.add_argument("--max-length", type=int, help="at most this many turns (replies)")
    ep.add_argument("--iteration", type=int, help="only episodes with a turn in this iteration")
    ep.add_argument("--limit", type=int, help="show at most this many rows")

    show = sub.add_parser("show", parents=[common],
                          help="every reply of an episode as the model saw it: turn by turn "
                               "(prompt, THINK, ACTION, reward, value, advantage), or, for a "
                               "conversation (packed, windowed or an agent's calls), message by "
                               "message with each reply's reward, value and advantage")
    show.add_argument("episode_id", metavar="EPISODE_ID", help="as `episodes` lists them")
    show.add_argument("run_dir", nargs="?", default=DEFAULT_RUN, metavar="RUN_DIR", help=RUN_HELP)
    show.add_argument("--no-prompt", action="store_true", help="leave the prompts out")
    show.add_argument("--frames", metavar="DIR", help="samples with image observations: write "
                      "the episode's frames to DIR as PNG")
    show.add_argument("--turn", type=int, help="only this turn (reply) of the episode, 0-based")

    gae = sub.add_parser("gae", parents=[run, common],
                         help="recompute advantages and returns from each file's own columns and "
                              "metadata; report the worst error (exit 1 above --tolerance)")
    gae.add_argument("--tolerance", type=float, default=1e-4,
                     help="largest error that passes (default: %(default)g)")

    sql = sub.add_parser("sql", parents=[common],
                         help="one read-only DuckDB SELECT over the views `turns` (one row per "
                              "reply), `samples` (one row per sample) and, for an eval dir, "
                              "`episodes`")
    sql.add_argument("query", metavar="QUERY", help="e.g. \"SELECT action, count(*) FROM turns "
                                                    "GROUP BY 1\"; columns: docs/design.md §4, "
                                                    "plus rank; in `turns` the reply's fields "
                                                    "and per-token lists cut to the reply")
    sql.add_argument("run_dir", nargs="?", default=DEFAULT_RUN, metavar="RUN_DIR", help=RUN_HELP)

    plot = sub.add_parser("plot", parents=[run, common],
                          help="PNGs: return and advantage distributions (per reply), action mix "
                               "per iteration")
    plot.add_argument("--out", default="audit-plots", help="folder for the PNGs (default: %(default)s)")

    diff = sub.add_parser("diff", parents=[common],
                          help="first iteration, rank and sample where token ids differ (exit 1), "
                               "or identical")
    diff.add_argument("run_a", metavar="RUN_A", help="a run dir (as RUN_DIR elsewhere)")
    diff.add_argument("run_b", metavar="RUN_B", help="the run dir to compare it with")
    return p


def _run(args: argparse.Namespace) -> Output:
    command = args.command
    if command == "diff":
        from longturn.audit.diff import diff_runs

        return diff_runs(open_run(args.run_a), open_run(args.run_b))
    run = open_run(args.run_dir)
    if command == "summary":
        from longturn.audit.summary import summarise

        return summarise(run)
    if command == "episodes":
        from longturn.audit.episodes import EpisodeFilter, list_episodes

        success = None if args.success is None else args.success == "yes"
        which = EpisodeFilter(args.task, success, args.min_length, args.max_length, args.iteration)
        return list_episodes(run, which, args.limit)
    if command == "show":
        from longturn.audit.show import show_episode

        return show_episode(run, args.episode_id, not args.no_prompt, args.turn, args.frames)
    if command == "gae":
        from longturn.audit.gae import audit_run

        return audit_run(run, args.tolerance)
    if command == "sql":
        from longturn.audit.sql import query

        return query(run, args.query)
    from longturn.audit.plot import plot_run

    return plot_run(run, Path(args.out))


def main(argv: Sequence[str] | None = None, prog: str = "longturn audit") -> int:
    args = _parser(prog).parse_args(argv)
    try:
        output = _run(args)
    except UserError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    try:
        print(output.render(args.json))
        sys.stdout.flush()
    except BrokenPipeError:  # `... | head`: the reader left, nothing to report
        sys.stderr.close()
    return output.status
