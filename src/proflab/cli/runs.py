"""``proflab runs``: the past runs of ``proflab run`` in a folder."""

from __future__ import annotations

import argparse
import os
import sys

from proflab.cli._table import frame_text

__all__ = ["add_parsers", "cmd_runs"]


def add_parsers(sub) -> None:
    rs = sub.add_parser(
        "runs",
        help="list past runs of proflab run (time, name, command, exit status, duration, top finding)",
        description="List the run directories under DIR (default proflab-runs), oldest first.",
    )
    rs.add_argument("root", nargs="?", default="proflab-runs", metavar="DIR", help="where the runs are (default proflab-runs)")
    rs.add_argument("--width", type=int, default=None, metavar="COLS", help="table width (default: the terminal's, or 80)")
    rs.set_defaults(func=cmd_runs)


def cmd_runs(args: argparse.Namespace) -> int:
    import polars as pl

    from proflab.collect.rundir import list_runs

    runs = list_runs(args.root)
    if not runs:
        print(f"no runs in {args.root}")
        return 0
    df = pl.DataFrame(
        {
            "started": [r.started for r in runs],
            "name": [r.name for r in runs],
            "exit": [r.exit_status for r in runs],
            "status": [r.status for r in runs],
            "duration_s": [r.duration_s for r in runs],
            "top_finding": [r.top_finding for r in runs],
            "command": [r.command for r in runs],
            "dir": [r.path.name for r in runs],
        },
        schema={"started": pl.String, "name": pl.String, "exit": pl.Int64, "status": pl.String,
                "duration_s": pl.Float64, "top_finding": pl.String, "command": pl.String, "dir": pl.String},
    )  # fmt: skip
    width = args.width or (os.get_terminal_size().columns if sys.stdout.isatty() else 80)
    sys.stdout.write(frame_text(df, width=width, limit=None))
    return 0
