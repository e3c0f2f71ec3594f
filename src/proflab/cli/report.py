"""``proflab report``: the single-file HTML report of a path; ``proflab demo``: the analysis of a
shipped real GPU trace, and its report."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from proflab.cli._common import check_perfetto, is_html, perfetto_arg, refuse_parts_with, write_atomic, write_html
from proflab.cli._reading import reading_args
from proflab.errors import UsageError

__all__ = ["add_parsers", "cmd_report", "cmd_demo"]


def add_parsers(sub) -> None:
    r = sub.add_parser(
        "report",
        help="the single-file HTML report of a trace, a job's traces or a run directory (opens in any browser, offline)",
        description=(
            "Analyse PATH as `proflab analyze` does and write one self-contained HTML page: the verdict and ranked "
            "findings, the breakdown and per-step charts, the timeline with idle gaps by cause, hot kernels, operators "
            "and copies, and for a run directory the GPU monitor, energy and Nsight Compute results."
        ),
        epilog="examples:\n  proflab report run.pt.trace.json.gz -o report.html\n  proflab report proflab-runs/20260101-120000-train",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("paths", nargs="+", metavar="PATH", help="trace file(s), a folder of traces or a run directory")
    r.add_argument("-o", "--output", metavar="FILE.html", help="write the page here (default: proflab-report.html in the current folder, never over an existing file)")
    r.add_argument("--top", type=int, default=15, metavar="N", help="hot kernels to list (default 15)")
    r.add_argument("--bare-step-ms", type=float, default=None, metavar="MS", help="the step time measured without the profiler (see analyze)")
    r.add_argument("--no-job", dest="job", action="store_false", help="several rank traces: separate reports only, no job view")
    perfetto_arg(r)
    reading_args(r).add_argument(
        "--all-parts", action="store_true",
        help="a trace over --memory-budget: the page of every event, analysed in consecutive parts that each fit (as "
             "analyze --all-parts; the timeline combined from the parts'), instead of a part from its middle",
    )
    r.set_defaults(func=cmd_report)
    d = sub.add_parser(
        "demo",
        help="see proflab work without a GPU: the analysis of a shipped real GPU trace, and its HTML report",
        description=(
            "Analyse a real torch.profiler trace recorded on an H100 (shipped with proflab: a training loop whose "
            "AdamW updates each parameter with its own kernels), print the diagnosis and write the HTML report."
        ),
    )
    d.add_argument("-o", "--out-dir", metavar="DIR", help="folder for the report (default: a new temporary folder)")
    d.add_argument("--width", type=int, default=None, metavar="COLS", help="terminal width (default: the terminal's, at most 100)")
    d.add_argument("--color", choices=("auto", "always", "never"), default="auto", help="colour in terminal output")
    d.set_defaults(func=cmd_demo)


def cmd_report(args: argparse.Namespace) -> int:
    from proflab.readers import expand_paths

    paths = expand_paths(args.paths)
    if args.top < 0:
        raise UsageError("--top must be >= 0")
    if args.output is None:
        args.output = str(_fresh_path("proflab-report", ".html"))
    elif not is_html(args.output):
        raise UsageError(f"{args.output}: the report is an HTML page; name it .html")
    out = Path(args.output).resolve()
    if any(out == p.resolve() for p in paths):
        raise UsageError(f"{args.output}: refusing to overwrite an input trace")
    if args.all_parts:
        refuse_parts_with(args)
    check_perfetto(args, paths)
    return write_html(args)  # (it says where the page went)


def _fresh_path(stem: str, suffix: str, folder: Path = Path(".")) -> Path:
    """``folder/stem.suffix``, or ``stem-2.suffix``, ... : a name that holds no file yet."""
    for i in range(1, 10_000):
        p = folder / (f"{stem}{suffix}" if i == 1 else f"{stem}-{i}{suffix}")
        if not p.exists():
            return p
    raise UsageError(f"{folder}: no free name for {stem}{suffix}")


def cmd_demo(args: argparse.Namespace) -> int:
    import json
    import tempfile
    from importlib import resources

    from proflab.cli.page import html_report
    from proflab.readers import load_trace as load
    from proflab.render import render
    from proflab.report.analyze import analyze

    data = resources.files("proflab") / "demo"
    truth = json.loads((data / "ground_truth.json").read_text(encoding="utf-8"))
    with resources.as_file(data / "mlp_foreach.light.pt.trace.json.gz") as trace_path:
        # the step time measured without the profiler in the recording process
        bare_ms = truth["bare_step_ms"]
        to_tty = sys.stdout.isatty()
        color = args.color == "always" or (args.color == "auto" and to_tty and "NO_COLOR" not in os.environ)
        width = args.width or (min(os.get_terminal_size().columns, 100) if to_tty else 80)
        print(f"proflab demo: {truth['description']}\n")
        trace = load(trace_path, cache=False)
        sys.stdout.write(render([analyze(trace, bare_step_ms=bare_ms)], "term", width=width, color=color))
        out_dir = Path(args.out_dir) if args.out_dir else Path(tempfile.mkdtemp(prefix="proflab-demo-"))
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"{out_dir}: cannot make the report's folder there ({e.strerror or e})") from e
        out = _fresh_path("proflab-demo-report", ".html", out_dir)
        write_atomic(out, html_report([trace_path], load=lambda p: trace, bare_step_ms=bare_ms, title="proflab demo"), say=False)
    print(f"\nHTML report: {out.resolve()}")
    return 0
