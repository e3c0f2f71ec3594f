"""``proflab analyze``: read traces, break GPU time down, find why the GPU idles, rank fixes."""

from __future__ import annotations

import argparse
from pathlib import Path

from proflab.cli._common import (
    analysing,
    check_perfetto,
    emit_perfetto,
    emit_reports,
    is_html,
    parts_shown,
    perfetto_arg,
    refuse_parts_with,
    report_output_args,
    write_atomic,
    write_html,
    write_operator_roofline,
)
from proflab.cli._reading import loader, reading_args, reading_options, warn_if_too_big
from proflab.errors import UsageError

__all__ = ["add_parsers", "cmd_analyze"]


def add_parsers(sub) -> None:
    a = sub.add_parser(
        "analyze",
        help="diagnose traces: torch.profiler/Kineto (.json, .json.gz, .json.xz), Nsight Systems (.sqlite, .nsys-rep), or folders of them",
        description="Read traces, break GPU time down, find why the GPU idles, rank fixes by estimated gain.",
    )
    a.add_argument("paths", nargs="+", metavar="TRACE", help="trace file(s) or tensorboard_trace_handler folder(s)")
    a.add_argument("--top", type=int, default=15, metavar="N", help="hot kernels to list (default 15)")
    a.add_argument("--bare-step-ms", type=float, default=None, metavar="MS", help="the loop's step time measured without the profiler: host and launch verdicts are judged against it (default: estimated from the trace)")
    j = a.add_argument_group("jobs (one trace per rank: a job report across ranks)")
    j.add_argument("--no-job", dest="job", action="store_false", help="several rank traces: separate reports only, no job report")
    j.add_argument("--scheduler", metavar="ADDRESS", help="analyse the ranks on this Dask cluster (tcp://host:8786)")
    j.add_argument("--workers", type=int, default=None, metavar="N", help="analyse the ranks on a local Dask cluster of N worker processes")
    reading_args(a).add_argument(
        "--all-parts", action="store_true",
        help="a trace over --memory-budget: analyse every event, in consecutive parts that each fit, as one report "
             "(slower: each part is read in turn) instead of a part from its middle; one report per trace",
    )
    report_output_args(a)
    perfetto_arg(a)
    a.add_argument("--timings", nargs="?", const="-", default=None, metavar="FILE.json",
                   help="print each phase's wall time and peak memory (decode, tables, timeline, what-if, memory, rules, "
                        "render) to stderr once done, or write them to FILE.json")  # fmt: skip
    a.add_argument("--roofline", metavar="FILE.svg",
                   help="also write the roofline of the operators (each class and the top operators against the device's "
                        "roofs; Nsight Compute's kernels beside them when the run directory has `proflab kernels` results) "
                        "of the first trace as an SVG")  # fmt: skip
    a.set_defaults(func=cmd_analyze)


def cmd_analyze(args: argparse.Namespace) -> int:
    if getattr(args, "timings", None) is None:
        return _analyze(args)
    import json
    import sys

    from proflab._timings import recording

    if args.timings != "-" and any(Path(args.timings).resolve() == Path(p).resolve() for p in args.paths):
        raise UsageError(f"{args.timings}: refusing to overwrite an input trace")
    with recording() as timings:
        rc = _analyze(args)
    if args.timings == "-":
        sys.stderr.write(timings.text() + "\n")
    else:
        write_atomic(Path(args.timings), json.dumps(timings.to_dict(), indent=1) + "\n")
    return rc


def _analyze(args: argparse.Namespace) -> int:
    from proflab.readers import expand_paths
    from proflab.render import format_for_path

    paths = expand_paths(args.paths)
    fmt = args.format or (format_for_path(args.output) if args.output else None) or "term"
    load = loader(args, show_progress=fmt == "term")
    if args.output:
        out = Path(args.output).resolve()
        if any(out == p.resolve() for p in paths):
            raise UsageError(f"{args.output}: refusing to overwrite an input trace")
    if args.top < 0:
        raise UsageError("--top must be >= 0")
    check_perfetto(args, paths)
    if args.roofline:
        if not args.roofline.lower().endswith(".svg"):
            raise UsageError(f"{args.roofline}: --roofline writes an SVG: name it .svg")
        if any(Path(args.roofline).resolve() == p.resolve() for p in paths):
            raise UsageError(f"{args.roofline}: refusing to overwrite an input trace")
    if args.all_parts:
        return _analyze_all_parts(args, paths, fmt)
    if is_html(args.output):  # the single-file HTML report, as `proflab report` writes it
        return write_html(args)
    ncu_dir = Path(args.paths[0]) / "ncu" if len(args.paths) == 1 and Path(args.paths[0]).is_dir() else None
    if ncu_dir is not None and (ncu_dir / "raw.csv").exists():
        # a run directory with `proflab kernels` results: both levels, ranked together
        from proflab.report.deepdive import deep_dive
        from proflab.readers.ncu import load as load_ncu

        pages = [ncu_dir / "raw.csv"] + ([ncu_dir / "details.csv"] if (ncu_dir / "details.csv").exists() else [])
        traces = [load(p) for p in paths]
        reports = [deep_dive(load_ncu(pages), t, top_kernels=args.top) for t in traces]
        if args.perfetto:
            emit_perfetto(args, traces[0], reports[0])
    elif len(paths) >= 2 and args.job or args.scheduler or args.workers:
        reports = _job_or_reports(args, paths)
        write_operator_roofline(args, reports)
        return emit_reports(args, reports, fmt)
    else:
        from proflab.collect.rundir import unprofiled_step_ms
        from proflab.report import cache as report_cache

        # a trace of a `proflab run` directory comes with the step time measured outside its window
        bare = [args.bare_step_ms or unprofiled_step_ms(p) for p in paths]
        # (an export that holds a whole job gets a job report, which is never cached: a cached
        # report for it exists only when it held one process)
        options = {"top": args.top, "steps": args.steps, "window": args.window, "job": args.job, "memory_budget": args.memory_budget}
        keys = [report_cache.key(p, {**options, "bare_step_ms": b}, args.cache) for p, b in zip(paths, bare)]
        reports = [None if args.perfetto else report_cache.get(k) for k in keys]  # --perfetto needs the trace
        if reports and all(r is not None for r in reports):  # analysed before: nothing to read
            write_operator_roofline(args, reports)
            return emit_reports(args, reports, fmt)
        from proflab.report.analyze import analyze

        traces = [load(p) for p in paths]
        if len(traces) == 1 and args.job and traces[0].meta.format != "kineto":
            # an Nsight Systems export of a whole job holds every rank's process
            from proflab.report.job import analyze_processes

            job = analyze_processes(traces[0], top_kernels=args.top, bare_step_ms=args.bare_step_ms)
            if job is not None:
                if args.perfetto:
                    raise UsageError(f"{paths[0]}: holds several ranks' processes; --perfetto marks one process's trace")
                write_operator_roofline(args, job)
                return emit_reports(args, job, fmt)
        with analysing(fmt == "term"):
            reports = [r or analyze(t, top_kernels=args.top, bare_step_ms=b) for r, t, b in zip(reports, traces, bare)]
        for k, r in zip(keys, reports):
            report_cache.put(k, r)
        if args.perfetto:
            emit_perfetto(args, traces[0], reports[0])
        write_operator_roofline(args, reports)
        return emit_reports(args, reports, fmt, traces=traces)
    write_operator_roofline(args, reports)
    return emit_reports(args, reports, fmt)


def _analyze_all_parts(args: argparse.Namespace, paths: list[Path], fmt: str) -> int:
    """``analyze --all-parts``: each trace's report of every event (``report.combine``),
    from the report cache when analysed before with the same options."""
    from proflab.collect.rundir import unprofiled_step_ms
    from proflab.report import cache as report_cache

    refuse_parts_with(args)
    if is_html(args.output):  # the single-file HTML report of every event
        return write_html(args)
    from proflab.report.analyze import analyze

    reports = []
    for p in paths:
        bare = args.bare_step_ms or unprofiled_step_ms(p)
        options = {"top": args.top, "all_parts": True, "memory_budget": args.memory_budget, "bare_step_ms": bare}
        key = report_cache.key(p, options, args.cache)
        report = report_cache.get(key)
        if report is None:
            warn_if_too_big(Path(p), args.memory_budget)
            with analysing(fmt == "term") as status:
                on_part = parts_shown(status, Path(p).name)
                report = analyze(p, top_kernels=args.top, bare_step_ms=bare, all_parts=True, memory_budget=args.memory_budget,
                                 cache=args.cache, on_part=on_part)
            report_cache.put(key, report)
        reports.append(report)
    write_operator_roofline(args, reports)
    # (a run directory's energy is read from its traces' windows and steps: they would be read
    # again, whole or in a part, past the budget the parts held; `proflab energy` reads them)
    return emit_reports(args, reports, fmt, energy_skipped="not with --all-parts: proflab energy RUN_DIR analyses it")


def _job_or_reports(args: argparse.Namespace, paths: list[Path]):
    """The job report when the traces are the ranks of one job (each names its rank, once);
    else each trace's own report (the rank tasks' reports: nothing is read twice)."""
    from proflab.report import job as jobs

    if args.workers is not None and args.workers < 1:
        raise UsageError("--workers must be >= 1")
    try:
        return jobs.analyze_job(
            paths, scheduler=args.scheduler, workers=args.workers, top_kernels=args.top,
            bare_step_ms=args.bare_step_ms, **reading_options(args),
        )
    except jobs.NotAJob as e:
        if args.scheduler or args.workers:
            raise UsageError(str(e)) from None
        return [s.report for s in e.summaries]
