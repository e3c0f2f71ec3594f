"""``proflab kernels``: Nsight Compute on the hot kernels of a trace, or its results imported, explained."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from proflab.cli._common import emit_reports, report_output_args, said_written, write_atomic
from proflab.errors import UsageError

__all__ = ["add_parsers", "cmd_kernels"]


def add_parsers(sub) -> None:
    k = sub.add_parser(
        "kernels",
        help="Nsight Compute deep dive on the hot kernels: bound class, occupancy, stalls, roofline",
        description=(
            "Profile only the kernels that matter with ncu (--clock-control none, targeted sections, launch skip/count) "
            "and explain each one; or read results you already have with --import."
        ),
        epilog=(
            "examples:\n  proflab kernels run.pt.trace.json.gz -- python train.py\n"
            "  proflab kernels --import report.ncu-rep\n  proflab kernels --import raw.csv details.csv --trace run.pt.trace.json.gz"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    k.add_argument("target", nargs="?", metavar="RUN_DIR|TRACE", help="the timeline that names the hot kernels")
    k.add_argument("--import", dest="imports", nargs="+", metavar="FILE", help="read ncu results instead: .ncu-rep, or CSV from --page raw / --page details")
    k.add_argument("--trace", metavar="TRACE", help="with --import: the timeline to join the results to")
    k.add_argument("--top", type=int, default=5, metavar="N", help="hot kernels to profile (default 5)")
    k.add_argument("-k", "--kernel", metavar="REGEX", help="profile the trace's kernels whose names match instead")
    k.add_argument("--launch-skip", type=int, metavar="N", help="matching launches to skip (default: two steps' worth)")
    k.add_argument("--launch-count", type=int, metavar="N", help="matching launches to profile (default: one step's worth, at most 50)")
    k.add_argument("--set-full", action="store_true", help="collect ncu's full set instead of the targeted sections (slow)")
    k.add_argument("--replay-mode", choices=("kernel", "application", "range", "app-range"), help="ncu replay mode")
    k.add_argument("--nvtx-include", action="append", metavar="EXPR", help="only kernels inside these NVTX ranges (ncu --nvtx-include)")
    k.add_argument("--timeout", type=float, metavar="S", help="stop ncu after S seconds, keeping what it profiled")
    k.add_argument("--ncu-dir", metavar="DIR", help="where ncu's report and CSV pages go (default: RUN_DIR/ncu or ./proflab-ncu-TIME)")
    k.add_argument("--roofline", metavar="FILE", help="write the roofline chart here (.svg or .png)")
    report_output_args(k)
    k.set_defaults(func=cmd_kernels)


def _trace_in(target: str | None):
    """The trace a RUN_DIR or TRACE argument names (None when not given)."""
    if not target:
        return None
    from proflab.readers import load_trace as load
    from proflab.readers import expand_paths

    paths = expand_paths([target])
    if len(paths) != 1:
        raise UsageError(f"{target}: holds {len(paths)} traces; pass the one to use")
    return load(paths[0])


def cmd_kernels(args: argparse.Namespace) -> int:
    import time

    from proflab.report.deepdive import deep_dive
    from proflab.readers.ncu import load as load_ncu
    from proflab.render import format_for_path, render

    fmt = args.format or (format_for_path(args.output) if args.output else None) or "term"
    cmd = args.trailing
    notes: list[str] = []
    if args.imports:
        if cmd:
            raise UsageError("--import reads existing results; it takes no program to run")
        profile = load_ncu(args.imports)
        trace = _trace_in(args.trace or args.target)
        out_dir = None
    else:
        from proflab.collect import ncu as ncu_collect

        if args.top < 1:
            raise UsageError("--top must be >= 1")
        trace = _trace_in(args.target)
        if trace is None:
            raise UsageError("give the run directory or trace that names the hot kernels, then -- CMD (or --import FILE)")
        avail = ncu_collect.available()
        if not avail.ok:
            raise ncu_collect.NcuMissing(avail.reason + "; or import results made elsewhere: proflab kernels --import FILE")
        plan = ncu_collect.plan_from_trace(trace, top=args.top, kernel_regex=args.kernel,
                                           launch_skip=args.launch_skip, launch_count=args.launch_count)
        target = Path(args.target)
        out_dir = Path(args.ncu_dir) if args.ncu_dir else (
            target / "ncu" if target.is_dir() else Path(f"proflab-ncu-{time.strftime('%Y%m%d-%H%M%S')}"))
        out_dir.mkdir(parents=True, exist_ok=True)
        argv = ncu_collect.build_argv(avail.path, plan, cmd, out_dir / "report", full=args.set_full,
                                      replay_mode=args.replay_mode, nvtx_include=args.nvtx_include)
        print(f"proflab: profiling {len(plan.functions)} kernel(s) with ncu "
              f"(skip {plan.launch_skip}, count {plan.launch_count}): {', '.join(plan.functions)}", file=sys.stderr)
        run = ncu_collect.run_ncu(argv, out_dir, timeout_s=args.timeout)
        profile = load_ncu([run.raw_csv, run.details_csv])
        notes += list(plan.notes)
        notes.append(f"ncu ran {run.wall_s:.1f} s; report {run.report}")
        if run.timed_out:
            notes.append(f"ncu was stopped after --timeout {args.timeout:g} s: these are the kernels it had profiled by then")
    report = deep_dive(profile, trace)
    if notes:
        from dataclasses import replace

        report = replace(report, notes=(*report.notes, *notes))
    chart = args.roofline or (str(out_dir / "roofline.svg") if out_dir else None)
    if chart:
        from proflab.render.roofline import write_roofline

        write_roofline(list(report.verdicts), chart)
        said_written(Path(chart), "the roofline")
    if out_dir is not None:
        write_atomic(out_dir / "kernels.json", render([report], "json", width=80, color=False))
    return emit_reports(args, [report], fmt)
