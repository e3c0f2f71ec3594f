"""``proflab run``: profile an unmodified program and analyse what it recorded."""

from __future__ import annotations

import argparse
import os
import sys

from proflab.cli._recording import recording_args, recording_options

__all__ = ["add_parsers", "cmd_run"]


def add_parsers(sub) -> None:
    r = sub.add_parser(
        "run",
        help="profile an unmodified program: proflab run [options] -- python train.py ...",
        description=(
            "Run a program under torch.profiler (CPU + CUDA; a window of training steps after "
            "warm-up, steps taken from the optimizer or proflab.step(), else a time window; or the program's own "
            "cudaProfilerStart/Stop range with --capture cuda-profiler-api) or "
            "Nsight Systems, with the GPU monitor sampling NVML alongside. Writes a run "
            "directory (traces, monitor.parquet, meta.json, analysis.json, summary.txt), prints "
            "the analysis and exits with the program's exit status."
        ),
        epilog="example: proflab run --active 10 -- python train.py --epochs 1",
    )
    r.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS", help="the program and its arguments")
    g = r.add_argument_group("where")
    g.add_argument("-o", "--out", default="proflab-runs", metavar="DIR", help="runs folder (default proflab-runs)")
    g.add_argument("--name", help="run name (default: the script's name)")
    recording_args(r)
    g = r.add_argument_group("output")
    g.add_argument("--no-analyze", dest="analyze", action="store_false", help="record only; no analysis")
    g.add_argument("--top", type=int, default=15, metavar="N", help="hot kernels to list (default 15)")
    g.add_argument("--width", type=int, default=None, metavar="COLS", help="terminal width (default: the terminal's, at most 100)")
    g.add_argument("--color", choices=("auto", "always", "never"), default="auto", help="colour in terminal output")
    r.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from proflab.collect.launcher import RunOptions, run

    # main() takes everything after the first "--" as args.trailing
    cmd = list(args.cmd) + (["--"] if args.cmd and args.trailing else []) + args.trailing
    to_tty = sys.stdout.isatty()
    opts = RunOptions(
        root=args.out, name=args.name, **recording_options(args), analyze=args.analyze, top=args.top,
        width=args.width or (min(os.get_terminal_size().columns, 100) if to_tty else 80),
        color=args.color == "always" or (args.color == "auto" and to_tty and "NO_COLOR" not in os.environ),
    )  # fmt: skip
    return run(cmd, opts)
