"""``proflab compare``: what changed between two runs and whether it is real; ``proflab baseline``:
the stored runs it compares against."""

from __future__ import annotations

import argparse
from pathlib import Path

from proflab.cli._common import analysing, emit_reports, parts_shown, refuse_parts_with, report_output_args
from proflab.cli._reading import loader, reading_args, reading_options
from proflab.errors import UsageError

__all__ = ["add_parsers", "cmd_compare", "cmd_baseline"]


def add_parsers(sub) -> None:
    c = sub.add_parser(
        "compare",
        help="before/after: what changed between two runs and whether it is real; a CI regression gate",
        description=(
            "Compare two traces, trace sets (folders) or run directories: median GPU-side step time with a "
            "confidence interval of its change (the runs of a side as replicates) and a noise floor, where the time moved, kernels matched by "
            "normalised name, operators, ranges, findings resolved/new/persisting, and for run directories "
            "the environment and energy. --baseline NAME compares against a stored baseline."
        ),
        epilog=(
            "examples:\n  proflab compare before.pt.trace.json.gz after.pt.trace.json.gz\n"
            "  proflab compare --fail-on-regression 5 -f md -o compare.md BASE_RUN NEW_RUN\n"
            "  proflab baseline save proflab-runs/20260101-120000-train && proflab compare --baseline main NEW_RUN"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("paths", nargs="+", metavar="PATH", help="BEFORE and AFTER: traces, folders of traces or run directories (only AFTER with --baseline)")
    c.add_argument("--baseline", metavar="NAME", help="use the stored baseline NAME as BEFORE (see proflab baseline)")
    c.add_argument("--baseline-dir", default=".proflab/baselines", metavar="DIR", help="where baselines are stored (default .proflab/baselines)")
    c.add_argument("--threshold", type=float, default=None, metavar="PCT", help="noise floor in %%: smaller changes are no_change even where clear (default 5; noise itself is in the interval of the change)")
    c.add_argument("--fail-on-regression", type=float, default=None, metavar="PCT", help="exit 1 when the verdict is a regression of more than PCT %%")
    c.add_argument("--unprofiled-steps", nargs=2, metavar=("BEFORE_FILE", "AFTER_FILE"),
                   help="step times in ms measured without the profiler (a JSON list, or one number per line): the verdict rests on them")
    c.add_argument("--top", type=int, default=15, metavar="N", help="hot kernels per report (default 15)")
    reading_args(c).add_argument(
        "--all-parts", action="store_true",
        help="a trace over --memory-budget: compare every event, each trace analysed in consecutive parts that each fit "
             "(as analyze --all-parts), instead of a part from its middle",
    )
    report_output_args(c)
    c.set_defaults(func=cmd_compare)
    b = sub.add_parser(
        "baseline",
        help="store a run (or trace) as a project's baseline for proflab compare --baseline; list baselines",
        description="proflab baseline save PATH [--name NAME] copies a run directory or trace(s) into DIR/NAME; proflab baseline list shows them.",
    )
    b.add_argument("action", choices=("save", "list"), help="save PATH as baseline NAME, or list the baselines")
    b.add_argument("path", nargs="?", metavar="PATH", help="run directory, trace, or folder of traces (save)")
    b.add_argument("--name", default="main", help="baseline name (default main)")
    b.add_argument("--baseline-dir", default=".proflab/baselines", metavar="DIR", help="where baselines are stored (default .proflab/baselines)")
    b.set_defaults(func=cmd_baseline)


def _baseline_path(root: str, name: str) -> Path:
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise UsageError(f"{name!r}: a baseline name is one plain word (letters, digits, -, _)")
    return Path(root) / name


def cmd_compare(args: argparse.Namespace) -> int:
    from proflab.report.compare import compare_runs as compare
    from proflab.readers import expand_paths
    from proflab.render import format_for_path

    if args.baseline:
        base = _baseline_path(args.baseline_dir, args.baseline)
        if not base.is_dir():
            raise UsageError(f"{base}: no baseline {args.baseline!r}; store one with: proflab baseline save PATH --name {args.baseline}")
        sides = [str(base), *args.paths]
        if len(args.paths) != 1:
            raise UsageError("with --baseline, give one path: the run to compare against it")
    else:
        sides = args.paths
        if len(sides) != 2:
            raise UsageError(f"compare takes two paths, BEFORE and AFTER (got {len(sides)}); a trace set is a folder")
    if args.fail_on_regression is not None and args.fail_on_regression < 0:
        raise UsageError("--fail-on-regression must be >= 0")
    if args.top < 0:
        raise UsageError("--top must be >= 0")
    fmt = args.format or (format_for_path(args.output) if args.output else None) or "term"
    if args.output:
        out = Path(args.output).resolve()
        if any(out == p.resolve() for p in expand_paths(sides)):
            raise UsageError(f"{args.output}: refusing to overwrite an input trace")
    load = loader(args, show_progress=fmt == "term")
    unprofiled = tuple(_step_times(f) for f in args.unprofiled_steps) if args.unprofiled_steps else None
    if unprofiled is None:
        # two `proflab run` directories carry the step times measured outside their windows
        from proflab.collect.rundir import unprofiled_steps_ms

        measured = [unprofiled_steps_ms(p) for p in sides]
        unprofiled = tuple(measured) if all(m is not None for m in measured) else None
    if args.all_parts:
        refuse_parts_with(args)
    with analysing(args.all_parts and fmt == "term") as status:
        comparison = compare(sides[0], sides[1], threshold_pct=args.threshold, top_kernels=args.top, load_trace=load,
                             unprofiled_steps_ms=unprofiled, all_parts=args.all_parts, on_part=parts_shown(status), **reading_options(args))
    emit_reports(args, comparison, fmt)
    if args.fail_on_regression is None:
        return 0
    verdict, why = comparison.verdict
    if verdict == "unknown":
        raise UsageError(f"cannot gate: {why}")
    return comparison.gate(args.fail_on_regression)


def _step_times(path: str) -> list[float]:
    """Step times in ms from a file: a JSON list of numbers, or one number per line."""
    import json
    import math

    from proflab.errors import InputNotFound, SchemaError

    p = Path(path)
    if not p.is_file():
        raise InputNotFound(p, "no such file")
    text = p.read_text(errors="replace").strip()
    try:
        values = json.loads(text) if text.startswith("[") else [float(x) for x in text.split()]
    except ValueError as e:
        raise SchemaError(p, f"expected step times in ms, a JSON list or one number per line ({e})") from e
    if not isinstance(values, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise SchemaError(p, "expected a list of numbers (step times in ms)")
    if not values or any(not math.isfinite(v) or v <= 0 for v in values):
        raise SchemaError(p, "expected positive, finite step times in ms")
    return [float(v) for v in values]


def cmd_baseline(args: argparse.Namespace) -> int:
    import shutil
    import tempfile

    root = Path(args.baseline_dir)
    if args.action == "list":
        for d in sorted(root.iterdir()) if root.is_dir() else []:
            src = (d / "SOURCE").read_text().strip() if (d / "SOURCE").is_file() else "?"
            print(f"{d.name}\t{src}")
        return 0
    if not args.path:
        raise UsageError("baseline save needs the PATH of a run directory or trace")
    from proflab.readers import expand_paths

    src = Path(args.path)
    traces = expand_paths([src])  # refuses a path with no traces, one line
    dest = _baseline_path(str(root), args.name)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{args.name}.", dir=root))
    try:
        if src.is_dir() and (src / "meta.json").is_file():
            # a run directory keeps its shape: meta.json, monitor.parquet, traces/
            (tmp / "traces").mkdir()
            for f in ("meta.json", "monitor.parquet"):
                if (src / f).is_file():
                    shutil.copy2(src / f, tmp / f)
            for t in traces:
                shutil.copy2(t, tmp / "traces" / t.name)
        else:
            for t in traces:
                shutil.copy2(t, tmp / t.name)
        (tmp / "SOURCE").write_text(f"{args.path}\n")
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"baseline {args.name!r}: {len(traces)} trace(s) from {args.path} in {dest}")
    return 0
