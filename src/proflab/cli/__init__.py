"""The ``proflab`` command. ``main(argv) -> int``: one function per subcommand; every
ProflabError becomes one line on stderr and exit status 2. ``entry()``: the command itself
(the console script and ``python -m proflab``), which ends the process once ``main`` is done."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from pathlib import Path

from proflab._version import __version__
from proflab._io import atomic_path
from proflab.errors import ProflabError, UsageError

__all__ = ["main", "entry"]

SQL_FORMATS = ("table", "csv", "json", "parquet")
_SQL_SUFFIX = {".csv": "csv", ".json": "json", ".parquet": "parquet", ".pq": "parquet", ".txt": "table"}
_TABLE_ROWS = 50
_MAX_CELL = 48  # widest column in table output; longer values end in an ellipsis
_GUTTER = 3


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="proflab",
        description="GPU performance diagnosis: where the time goes, why, what to change, and how much it saves.",
    )
    p.add_argument("--version", action="version", version=f"proflab {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    a = sub.add_parser(
        "analyze",
        help="diagnose traces: torch.profiler/Kineto (.json, .json.gz), Nsight Systems (.sqlite, .nsys-rep), or folders of them",
        description="Read traces, break GPU time down, find why the GPU idles, rank fixes by estimated gain.",
    )
    a.add_argument("paths", nargs="+", metavar="TRACE", help="trace file(s) or tensorboard_trace_handler folder(s)")
    a.add_argument("--top", type=int, default=15, metavar="N", help="hot kernels to list (default 15)")
    a.add_argument("--bare-step-ms", type=float, default=None, metavar="MS", help="the loop's step time measured without the profiler: host and launch verdicts are judged against it (default: estimated from the trace)")
    j = a.add_argument_group("jobs (one trace per rank: a job report across ranks)")
    j.add_argument("--no-job", dest="job", action="store_false", help="several rank traces: separate reports only, no job report")
    j.add_argument("--scheduler", metavar="ADDRESS", help="analyse the ranks on this Dask cluster (tcp://host:8786)")
    j.add_argument("--workers", type=int, default=None, metavar="N", help="analyse the ranks on a local Dask cluster of N worker processes")
    _reading_args(a).add_argument(
        "--all-parts", action="store_true",
        help="a trace over --memory-budget: analyse every event, in consecutive parts that each fit, as one report "
             "(slower: each part is read in turn) instead of a part from its middle; one report per trace",
    )
    _report_output_args(a)
    _perfetto_arg(a)
    a.set_defaults(func=cmd_analyze)
    q = sub.add_parser(
        "sql",
        help="SQL over a trace's tables (gpu, cpu, steps, kernels, gaps, ...)",
        description=(
            "Run one SQL query (DuckDB's dialect) over the normalized tables of a trace. "
            "Times are integer ns, sizes bytes. --tables lists every table with its columns."
        ),
        epilog='example: proflab sql run.pt.trace.json.gz "SELECT name, count(*), sum(dur_ns) FROM kernels GROUP BY name"',
    )
    q.add_argument("trace", nargs="?", metavar="TRACE",
                   help="a trace file; or a run directory or folder of rank traces: the job's tables")  # fmt: skip
    q.add_argument("query", nargs="?", metavar="SQL", help="the query; quote it")
    q.add_argument("--tables", action="store_true", help="list every table with its columns and types, then exit")
    q.add_argument("-f", "--format", choices=SQL_FORMATS, help="output format (default: table, or from -o suffix)")
    q.add_argument("-o", "--output", metavar="FILE", help="write here (atomically): .csv, .json, .parquet, .txt")
    q.add_argument("--limit", type=int, default=None, metavar="N", help="rows to output (default: 50 in table format, all otherwise; 0: all)")
    q.add_argument("--width", type=int, default=None, metavar="COLS", help="table width (default: the terminal's, or 80)")
    _reading_args(q)
    q.set_defaults(func=cmd_sql)
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
    _report_output_args(k)
    k.set_defaults(func=cmd_kernels)
    _compare_parser(sub)
    sc = sub.add_parser(
        "scaling",
        help="scaling efficiency of one program across GPU counts, and where the loss goes",
        description=(
            "Each RUN is one run of the same program at some GPU count: a proflab run directory, a folder of its "
            "rank traces, or one trace (1 GPU). Reports weak or strong scaling efficiency against the run with the "
            "fewest GPUs and splits the loss per step into exposed communication, imbalance and the rest."
        ),
        epilog=(
            "examples:\n  proflab scaling --mode weak runs/1gpu runs/2gpu runs/4gpu --plot scaling.png\n"
            "  proflab scaling --mode weak --gpus 1,2 -- torchrun --nproc_per_node {gpus} train.py"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sc.add_argument("runs", nargs="*", metavar="RUN", help="run directory, folder of rank traces, or trace file")
    sc.add_argument(
        "--gpus", metavar="N,N,...",
        help="launch the command after -- once per GPU count under proflab run (its {gpus} placeholder, or the "
        "value of its --nproc_per_node / --nproc-per-node, set to each count), then compare the runs",
    )  # fmt: skip
    sc.add_argument("--runs-dir", default=None, metavar="DIR", help="with --gpus: where the run directories go (default: proflab-runs)")
    sc.add_argument("--mode", required=True, choices=("weak", "strong"), help="weak: same work per GPU; strong: same total work")
    sc.add_argument("--plot", metavar="FILE", help="write the efficiency and loss plot here (.png, .svg, .pdf)")
    _format_arg(sc)
    sc.add_argument("-o", "--output", metavar="FILE", help="write here (atomically): .json, .md, .txt")
    _recording_args(sc)  # with --gpus: what each proflab run records, as `proflab run` takes them
    sc.set_defaults(func=cmd_scaling)
    en = sub.add_parser(
        "energy",
        help="energy of a proflab run: joules per GPU, per profiled window and step, power cap and thermal throttling",
        description=(
            "Reads RUN_DIR's monitor.parquet (NVML samples) and traces: energy per GPU from the NVML energy counter "
            "(integrated power as the cross-check), idle power and the energy spent idle, the energy of each trace's "
            "profiled window, GPU-side step and user range where the counter resolves them, TFLOPS/W where the "
            "FLOPs are known (GEMM shapes of a --record-shapes trace, or --flops-per-step), and power_capped / "
            "thermal_throttled findings."
        ),
        epilog="example: proflab energy proflab-runs/20260101-120000-train -f json",
    )
    en.add_argument("run_dir", metavar="RUN_DIR", help="a proflab run directory with monitor.parquet")
    _format_arg(en)
    en.add_argument("-o", "--output", metavar="FILE", help="write here (atomically): .json, .md, .txt")
    en.add_argument("--flops-per-step", type=float, metavar="FLOP",
                    help="FLOPs of one step of one rank, when known (default: from the GEMM shapes the trace recorded)")
    en.set_defaults(func=cmd_energy)
    me = sub.add_parser(
        "memory",
        help="GPU memory: peak allocated/reserved, what holds it, leaks, fragmentation, headroom; a plot",
        description=(
            "Reads a trace recorded with profile_memory (or a proflab run directory: its trace, NVML samples and "
            "memory snapshot), or a CUDA memory snapshot on its own (JSON, or a _dump_snapshot pickle, read with "
            "no global allowed). -o FILE.png/.svg draws allocated and reserved memory over the window, the peak "
            "and the steps marked."
        ),
        epilog="example: proflab memory proflab-runs/20260101-120000-train -o mem.png",
    )
    me.add_argument("path", metavar="PATH", help="trace file, proflab run directory, or memory snapshot")
    _format_arg(me)
    me.add_argument("-o", "--output", metavar="FILE", help="a plot (.png, .svg) or the section (.json, .md, .txt), atomically")
    me.set_defaults(func=cmd_memory)
    _run_parser(sub)
    _doctor_parser(sub)
    _report_parser(sub)
    _demo_parser(sub)
    rs = sub.add_parser(
        "runs",
        help="list past runs of proflab run (time, name, command, exit status, duration, top finding)",
        description="List the run directories under DIR (default proflab-runs), oldest first.",
    )
    rs.add_argument("root", nargs="?", default="proflab-runs", metavar="DIR", help="where the runs are (default proflab-runs)")
    rs.add_argument("--width", type=int, default=None, metavar="COLS", help="table width (default: the terminal's, or 80)")
    rs.set_defaults(func=cmd_runs)
    ca = sub.add_parser(
        "cache",
        help="list or clear the cache of large traces' tables and reports",
        description=("Large traces (16 MB and more) are kept as columnar tables after their first read, and their "
                     "reports after each analysis, in $PROFLAB_CACHE_DIR (default ~/.cache/proflab), trimmed to "
                     "$PROFLAB_CACHE_MAX_MB (default 4096), least recently used first. Without options: where it is "
                     "and what it holds."),
    )
    cg = ca.add_mutually_exclusive_group()
    cg.add_argument("--list", action="store_true", help="every entry, most recently used first")
    cg.add_argument("--clear", action="store_true", help="remove every entry")
    ca.set_defaults(func=cmd_cache)
    return p


def _perfetto_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--perfetto", metavar="OUT.json", help=(
        "also write the trace with the findings marked on it (idle gaps by cause, findings, GPU-side steps, "
        "GPU busy and monitor power counters) for ui.perfetto.dev or chrome://tracing; gzip when OUT ends .gz"))


def _check_perfetto(args: argparse.Namespace, paths: list) -> None:
    """--perfetto: one trace, never written over an input."""
    if not getattr(args, "perfetto", None):
        return
    if len(paths) != 1:
        raise UsageError(f"--perfetto marks one trace; {len(paths)} were given")
    if not args.perfetto.endswith((".json", ".json.gz")):
        raise UsageError(f"{args.perfetto}: --perfetto writes Trace Event Format JSON: name it .json or .json.gz")
    out = Path(args.perfetto).resolve()
    if any(out == Path(p).resolve() for p in [*paths, *args.paths]):
        raise UsageError(f"{args.perfetto}: refusing to overwrite an input trace")
    if args.output and Path(args.output).resolve() == out:
        raise UsageError(f"{args.perfetto}: --perfetto and -o name the same file")


def _emit_perfetto(args: argparse.Namespace, trace, report) -> None:
    """Write --perfetto (a run directory's monitor.parquet gives the power counters)."""
    if not getattr(args, "perfetto", None):
        return
    from proflab.render.perfetto import write_perfetto

    monitor = Path(args.paths[0]) / "monitor.parquet" if len(args.paths) == 1 and Path(args.paths[0]).is_dir() else None
    sliced = bool(getattr(args, "steps", None) or getattr(args, "window", None))
    write_perfetto(trace, report, args.perfetto, monitor=monitor, keep_original=not sliced)
    print(f"proflab: marked trace written to {args.perfetto} (open it in ui.perfetto.dev)", file=sys.stderr)


def _doctor_parser(sub) -> None:
    d = sub.add_parser(
        "doctor",
        help="what this machine can profile, and why not: torch/CUDA/CUPTI, GPUs, NVML/GPM, ncu/nsys, counter permission",
        description=(
            "One line per check (ok / MISSING / WARNING, with the reason and the fix): Python, torch and its CUDA build, "
            "CUDA, CUPTI, NVML (driver), the GPUs, GPM, ncu and nsys with their versions, the GPU performance-counter "
            "permission (ERR_NVGPUCTRPERM), write access to the run folder and its free disk."
        ),
        epilog=(
            "exit status: 0 when torch.profiler can profile a GPU program here (torch imports, is a CUDA build, sees a "
            "GPU, records CUDA activity through CUPTI, and the run folder is writable); 1 when it cannot; 2 on bad usage."
        ),
    )
    d.add_argument("--dir", default=None, metavar="DIR", help="the run folder to check (default proflab-runs)")
    d.add_argument("--python", default=None, metavar="PYTHON", help="the interpreter that runs your program (default: this one)")
    d.add_argument("--ncu-probe", action="store_true", help="also profile one tiny kernel with ncu: the definitive counter-permission test")
    d.add_argument("-f", "--format", choices=("term", "json"), default="term", help="output format (default term)")
    d.add_argument("-o", "--output", metavar="FILE", help="write here (atomically) instead of stdout")
    d.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    from proflab.collect.doctor import doctor
    from proflab.collect.rundir import DEFAULT_ROOT
    from proflab.render.doctor import render_doctor

    rep = doctor(folder=args.dir or DEFAULT_ROOT, python=args.python, ncu_probe=args.ncu_probe)
    _write_out(args, render_doctor(rep.to_dict(), args.format))
    return 0 if rep.can_profile else 1


def cmd_cache(args: argparse.Namespace) -> int:
    import time

    from proflab.readers import _cachedir

    root = _cachedir.cache_root()
    if args.clear:
        n, size = _cachedir.clear(root)
        print(f"removed {n} entries ({size / 1e6:.1f} MB) from {root}")
        return 0
    items = [e for e in _cachedir.entries(root) if e.kind != "partial"]
    total = sum(e.bytes for e in items)
    print(f"{root}: {len(items)} entries, {total / 1e6:.1f} MB (limit {_cachedir.max_bytes() / 1e6:.0f} MB)")
    if args.list:
        for e in items:
            used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.used))
            print(f"  {used}  {e.kind:<7} {e.bytes / 1e6:>9.1f} MB  {e.path.name}")
    return 0


def _reading_args(p: argparse.ArgumentParser):
    """--steps/--window, --no-cache, --memory-budget: the reading group (returned)."""
    g = p.add_argument_group("reading")
    part = g.add_mutually_exclusive_group()
    part.add_argument("--steps", metavar="FIRST:STOP", help="only profiler steps FIRST to STOP-1 (10:20, 10:, :20, or one step N)")
    part.add_argument("--window", metavar="START:END",
                      help="only this time window from the trace's first event, events clipped to it (100ms:250ms; units ns, us, ms, s; ms if none)")
    g.add_argument("--no-cache", dest="cache", action="store_false", default=None,
                   help="neither read nor write the columnar cache of large traces")
    g.add_argument("--memory-budget", type=_budget_bytes, default=_DEFAULT_BUDGET, metavar="SIZE",
                   help="analyse a trace that would need more memory than this in a part from its middle that fits, "
                        "and say how far it is like the whole (default 1.5G; 800M, 4GiB; none: read it whole; "
                        "--all-parts: every event, in parts that fit)")
    return g


_DEFAULT_BUDGET = 1_500_000_000  # bytes (readers.budget.DEFAULT_BUDGET, not imported: --help stays instant)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


def _budget_bytes(text: str) -> int | None:
    """``--memory-budget``: 1.5G, 800M, 4GiB, 2000000000 (bytes) or none."""
    if text.strip().lower() in ("none", "off"):
        return None
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a size such as 1.5G, 800M or 4GiB, or none")
    power = "kmgt".find(m.group(2).lower()) + 1 if m.group(2) else 0
    size = round(float(m.group(1)) * (1024 if m.group(3) else 1000) ** power)
    if size < 1_000_000:
        raise argparse.ArgumentTypeError(f"{text!r}: a budget is at least 1M (none: no limit)")
    return size


def _reading(args: argparse.Namespace) -> dict:
    """The reading options of the command line, as ``proflab.load`` takes them."""
    return {"cache": args.cache, "steps": args.steps, "window": args.window, "memory_budget": args.memory_budget}


def _loader(args: argparse.Namespace, *, show_progress: bool = False):
    """``load(path)`` with the reading options of the command line; with ``show_progress``
    and a terminal on stderr, a progress bar while a large trace is read."""
    def read(p):
        from proflab.readers import load_trace as load

        if not (args.steps or args.window):
            _warn_if_too_big(Path(p), args.memory_budget)
        if not (show_progress and sys.stderr.isatty()):
            return load(p, **_reading(args))
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        from proflab.readers import _progress

        bar = Progress(TextColumn("reading {task.description}"), BarColumn(), TimeElapsedColumn(),
                       console=Console(stderr=True), transient=True)
        task = bar.add_task(Path(p).name, total=1.0)

        def sink(fraction):
            if not bar.live.is_started:
                bar.start()
            bar.update(task, completed=fraction, total=None if fraction is None else 1.0)

        try:
            with _progress.reporting(sink):
                return load(p, **_reading(args))
        finally:
            bar.stop()

    return read


def _warn_if_too_big(path: Path, budget: int | None, available: int | None = None) -> None:
    """One line on stderr before an Nsight Systems export is read when what its read and
    analysis are estimated to need (``readers.budget``: the whole export's, or the
    budget's when that is smaller) exceeds the memory available now: the system may stop the
    process partway. The read goes on either way (swap, or a part of the estimate unused)."""
    from proflab.readers import budget as limits

    whole = limits.whole_bytes(path)
    available = _available_memory() if available is None else available
    if whole is None or available is None:
        return
    rows, need = whole
    need = need if budget is None else min(need, budget)
    if need <= available:
        return
    print(
        f"proflab: warning: {path.name} holds {rows:,} events; reading and analysing "
        f"{'it whole' if need == whole[1] else 'the part of it --memory-budget allows'} needs about {limits.size_text(need)} "
        f"(estimated from its tables' rows) and {limits.size_text(available)} is available; a smaller --memory-budget, "
        "--steps or --window reads less",
        file=sys.stderr,
    )


def _available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (Linux); None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _analysing(show: bool):
    """A spinner on a terminal's stderr while the read traces are analysed (seconds on a large
    one, after the read's own bar has gone); nothing in a pipe or for JSON and Markdown."""
    if not (show and sys.stderr.isatty()):
        return contextlib.nullcontext()
    from rich.console import Console

    return Console(stderr=True).status("analysing", spinner="dots")


def _parts_shown(status, name: str | None = None):
    """The ``on_part(n, label)`` that shows on the spinner (``_analysing``'s, or None) which
    part of a trace analysed in parts is being analysed."""
    def on_part(n: int, label: str) -> None:
        if status is not None:
            status.update(f"analysing {name + ': ' if name else ''}part {n} ({label})")

    return on_part


def _report_output_args(p: argparse.ArgumentParser) -> None:
    """-f/-o/--width/--color of the commands that print a Report (analyze, kernels)."""
    _format_arg(p)
    p.add_argument("-o", "--output", metavar="FILE", help="write the report here (atomically) instead of stdout")
    p.add_argument("--width", type=int, default=None, metavar="COLS", help="terminal width (default: the terminal's, at most 100)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto", help="colour in terminal output")


def _write_out(args: argparse.Namespace, text: str) -> int:
    """``text`` to -o (atomically) or stdout."""
    if args.output:
        _write_atomic(Path(args.output), text)
    else:
        sys.stdout.write(text)
    return 0


def _emit_reports(args: argparse.Namespace, reports: list, fmt: str, *, traces: list | None = None,
                  energy_skipped: str | None = None) -> int:
    """Render ``reports`` as ``fmt`` to -o (atomically) or stdout; for ``analyze`` of a run
    directory with GPU monitor samples, its energy section follows (terminal and Markdown),
    or with ``energy_skipped``, why it does not."""
    from proflab.render import render

    if _is_html(args.output):  # compare or kernels -o x.html: the page of these reports
        from proflab.render.html import render_html

        return _write_out(args, render_html(reports))
    to_tty = not args.output and sys.stdout.isatty()
    color = args.color == "always" or (args.color == "auto" and to_tty and "NO_COLOR" not in os.environ)
    width = args.width or (min(os.get_terminal_size().columns, 100) if to_tty else 80)
    doc = _run_energy(args.paths, traces, skipped=energy_skipped) if getattr(args, "command", None) == "analyze" else None
    if doc is not None and fmt == "json" and isinstance(reports, list):
        import dataclasses

        kw = {"energy": doc} if "error" not in doc else None
        reports = [dataclasses.replace(r, **(kw or {"notes": (*r.notes, f"energy: not analysed ({doc['error']})")}))
                   if hasattr(r, "energy") else r for r in reports]
    text = render(reports, fmt, width=width, color=color)
    if doc is not None and fmt in ("term", "md"):
        from proflab.render.energy import render_energy

        text += (f"\nEnergy: not analysed ({doc['error']})\n" if "error" in doc
                 else render_energy(doc, fmt, heading=False, width=width))
    return _write_out(args, text)


def _run_energy(paths: list[str], traces: list | None, skipped: str | None = None) -> dict | None:
    """The energy document of ``analyze RUN_DIR`` (None unless one run directory with
    monitor.parquet is analysed; its failure, or ``skipped``, is ``{"error": ...}``, never
    the analysis's)."""
    if len(paths) != 1 or not (Path(paths[0]) / "monitor.parquet").is_file():
        return None
    if skipped is not None:
        return {"error": skipped}
    from proflab.report.energy import energy

    try:
        return energy(paths[0], traces=traces).to_dict()
    except ProflabError as e:
        return {"error": str(e)}


def cmd_energy(args: argparse.Namespace) -> int:
    from proflab.report.energy import energy
    from proflab.render import format_for_path

    fmt = args.format or (format_for_path(args.output) if args.output else None) or "term"
    if args.flops_per_step is not None and not args.flops_per_step > 0:
        raise UsageError("--flops-per-step must be > 0")
    rep = energy(args.run_dir, flops_per_step=args.flops_per_step).to_dict()
    if fmt == "json":
        import json

        text = json.dumps(rep, indent=2) + "\n"
    else:
        from proflab.render.energy import render_energy

        text = render_energy(rep, fmt)
    return _write_out(args, text)


def cmd_memory(args: argparse.Namespace) -> int:
    from proflab.analysis.memory import memory_for_trace
    from proflab.readers import expand_paths
    from proflab.render import format_for_path
    from proflab.render.memory import plot_memory, render_memory

    path = Path(args.path)
    plot = args.output and Path(args.output).suffix.lower() in (".png", ".svg", ".pdf")
    fmt = args.format or (format_for_path(args.output) if args.output and not plot else None) or "term"
    from proflab.readers.memory import looks_like_snapshot, snapshot, snapshot_summary

    if path.is_file() and looks_like_snapshot(path):
        if plot:
            raise UsageError(f"{args.path}: a snapshot alone has no timeline to plot; give the trace or run directory")
        m = {"sources": {"snapshot": {"available": True, "path": path.name}}, "snapshot": snapshot_summary(snapshot(path))}
        return _write_out(args, render_memory(m, fmt))
    paths = expand_paths([args.path])
    if len(paths) != 1:
        raise UsageError(f"{args.path}: holds {len(paths)} traces; give one trace file")
    if args.output and Path(args.output).resolve() == paths[0].resolve():
        raise UsageError(f"{args.output}: refusing to overwrite an input trace")
    from proflab.readers import load_trace as load

    a = memory_for_trace(load(paths[0]))
    if a is None or not a.devices:
        why = "; ".join(m.reason for m in (a.missing if a else [])) or "not a Kineto trace with [memory] events"
        raise UsageError(f"{paths[0]}: no GPU memory to analyse ({why})")
    from proflab.rules.memory import memory_rules

    findings = [f.to_dict() for f in memory_rules(a)]
    if plot:
        with _output_file(Path(args.output)) as tmp:
            plot_memory(a, tmp, fmt=Path(args.output).suffix.lower()[1:])
        return 0
    return _write_out(args, render_memory(a.to_dict(), fmt, findings=findings))


def _compare_parser(sub) -> None:
    c = sub.add_parser(
        "compare",
        help="before/after: what changed between two runs and whether it is real; a CI regression gate",
        description=(
            "Compare two traces, trace sets (folders) or run directories: median GPU-side step time with a "
            "bootstrap confidence interval and a noise floor, where the time moved, kernels matched by "
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
    c.add_argument("--threshold", type=float, default=None, metavar="PCT", help="noise floor in %%: smaller changes are no_change (default: the largest of 5, the runs' own step spread and the host's share of the step x 51)")
    c.add_argument("--fail-on-regression", type=float, default=None, metavar="PCT", help="exit 1 when the verdict is a regression of more than PCT %%")
    c.add_argument("--unprofiled-steps", nargs=2, metavar=("BEFORE_FILE", "AFTER_FILE"),
                   help="step times in ms measured without the profiler (a JSON list, or one number per line): the verdict rests on them")
    c.add_argument("--top", type=int, default=15, metavar="N", help="hot kernels per report (default 15)")
    _reading_args(c).add_argument(
        "--all-parts", action="store_true",
        help="a trace over --memory-budget: compare every event, each trace analysed in consecutive parts that each fit "
             "(as analyze --all-parts), instead of a part from its middle",
    )
    _report_output_args(c)
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


def _run_parser(sub) -> None:
    r = sub.add_parser(
        "run",
        help="profile an unmodified program: proflab run [options] -- python train.py ...",
        description=(
            "Run a program under torch.profiler (CPU + CUDA; a window of training steps after "
            "warm-up, steps taken from the optimizer or proflab.step(), else a time window) or "
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
    _recording_args(r)
    g = r.add_argument_group("output")
    g.add_argument("--no-analyze", dest="analyze", action="store_false", help="record only; no analysis")
    g.add_argument("--top", type=int, default=15, metavar="N", help="hot kernels to list (default 15)")
    g.add_argument("--width", type=int, default=None, metavar="COLS", help="terminal width (default: the terminal's, at most 100)")
    g.add_argument("--color", choices=("auto", "always", "never"), default="auto", help="colour in terminal output")
    r.set_defaults(func=cmd_run)


def _recording_args(p) -> None:
    """What ``proflab run`` records and how it samples the GPU: run's options, and scaling's
    for the runs it launches."""
    g = p.add_argument_group("what is recorded")
    g.add_argument("--backend", choices=("torch", "nsys"), default="torch", help="torch.profiler (default) or Nsight Systems")
    g.add_argument("--window", choices=("auto", "steps", "time", "capture"), default="auto",
                   help="auto (default): steps, or a time window when no step comes; steps; time; "
                        "capture: inside proflab.capture() only")  # fmt: skip
    g.add_argument("--wait", type=int, default=3, metavar="N", help="steps skipped before recording (default 3)")
    g.add_argument("--warmup", type=int, default=1, metavar="N", help="profiler warm-up steps, discarded (default 1)")
    g.add_argument("--active", type=int, default=5, metavar="N", help="steps recorded (default 5)")
    g.add_argument("--delay", type=float, default=5.0, metavar="S",
                   help="time window: starts S s after torch is imported (auto: when no step came by then; default 5)")  # fmt: skip
    g.add_argument("--duration", type=float, default=10.0, metavar="S", help="time window length in s (default 10)")
    # The defaults of what is recorded live in one place, collect/defaults.py (RunOptions' too).
    from proflab.collect import defaults

    g.add_argument("--record-shapes", dest="record_shapes", action=argparse.BooleanOptionalAction,
                   default=defaults.RECORD_SHAPES,
                   help=f"record input shapes (default {'on' if defaults.RECORD_SHAPES else 'off'})")  # fmt: skip
    g.add_argument("--with-stack", action=argparse.BooleanOptionalAction, default=defaults.WITH_STACK,
                   help="record Python stacks (links kernels to your lines)")  # fmt: skip
    g.add_argument("--profile-memory", action="store_true", help="record tensor allocations")
    g.add_argument("--memory-snapshot", action="store_true", help="write a CUDA memory snapshot (CUDA only)")
    g.add_argument("--capture-range", action="store_true",
                   help="record only inside proflab.capture() (nsys: cudaProfilerApi capture range)")  # fmt: skip
    g.add_argument("--python-backtrace", action="store_true", help="nsys: Python backtraces of CUDA calls and Python sampling")
    g = p.add_argument_group("GPU monitor")
    g.add_argument("--no-monitor", dest="monitor", action="store_false", default=None, help="do not sample NVML")
    g.add_argument("--monitor-period", type=float, default=0.1, metavar="S", help="sampling period in s (default 0.1)")
    g = p.add_argument_group("the end")
    g.add_argument("--exit-timeout", type=float, default=60.0, metavar="S",
                   help="a process of the program still there S s after its main thread finished is hung at exit: "
                        "proflab says what it waited for, keeps what was recorded, ends it and exits 124 "
                        "(default 60; 0: wait for ever)")  # fmt: skip


def _recording_options(args: argparse.Namespace) -> dict:
    """RunOptions' fields from ``_recording_args``' options."""
    return dict(
        backend=args.backend, window=args.window, wait=args.wait, warmup=args.warmup, active=args.active,
        delay_s=args.delay, duration_s=args.duration, record_shapes=args.record_shapes, with_stack=args.with_stack,
        profile_memory=args.profile_memory, memory_snapshot=args.memory_snapshot, capture_range=args.capture_range,
        python_backtrace=args.python_backtrace, monitor=args.monitor, monitor_period_s=args.monitor_period,
        exit_timeout_s=args.exit_timeout,
    )  # fmt: skip


def _recording_defaults() -> dict:
    p = argparse.ArgumentParser(add_help=False)
    _recording_args(p)
    return _recording_options(p.parse_args([]))


def _format_arg(p) -> None:
    """The -f/--format option of the commands that write a report: term, json or md."""
    p.add_argument("-f", "--format", choices=("term", "json", "md"), help="output format (default: term, or from -o suffix)")


def _return_freed_memory(setting: str | None = None) -> None:
    """Polars' allocator (jemalloc) keeps freed pages for 10 s by default; a read builds and
    drops a table per slice, so a large trace held up to twice its tables in freed pages
    (500 MB trace: 386 -> 187 MiB after reading). Return them at once (``_AT_ONCE``: ~3 % more
    CPU time on a Kineto trace), or as ``setting`` says (``_allocator_setting``: kept a while
    where the budget has room). Only when polars is not loaded yet (the setting is read when
    it starts), and never over the user's own setting; the reader's helper process inherits it.

    Polars (1.x) writes its own default into the environment when it is imported, followed by
    any setting it found there, so a process started from one that had imported polars (a test
    run, a notebook) inherits that default: it is polars', not the user's, and is dropped
    (it raised the peak of a 126 MB nsys export from 416 to 604 MiB); what followed it is kept."""
    if "polars" in sys.modules:
        return
    from proflab._env import set_own

    inherited = os.environ.get("_RJEM_MALLOC_CONF")
    own = _POLARS_MALLOC_DEFAULT.sub("", inherited) if inherited is not None else ""
    set_own("_RJEM_MALLOC_CONF", own or setting or _AT_ONCE)


_AT_ONCE = "dirty_decay_ms:0,muzzy_decay_ms:0"
# Freed pages kept a while are taken again by the next table built instead of being returned
# and faulted in anew. An Nsight Systems export's, 100 ms: its whole analysis 13-19 % faster
# (0.5 to 2.1 GB H100 exports and 0.7 to 1.5 GB T4 ones: 1,048 MB, 10.3 -> 8.5 s, system time
# 4.6 -> 2.7 s), its peak from 5 % lower to 14 % higher (the 521 MB export: 766 -> 848-873 MiB).
_EXPORT_KEPT = "dirty_decay_ms:100,muzzy_decay_ms:0"
# A Kineto trace's, 10 ms and one arena for all threads. The slices are decoded on two threads,
# each with an arena of its own, which nothing uses once the decode is done: their freed pages
# waited there, however short the keep time, for the allocator's background thread (kept 100
# ms, the 514 MB benchmark trace peaked at 430-490 MiB, past its bound of 0.4 x its size + 300
# MB, 482 MiB). In one arena the tables built next take them, and the work of every thread
# returns those kept past 10 ms; with the merge no longer copying its parts (``_merge``) the
# 514 MB trace takes 2.85 -> 2.39 s (median of six, interleaved), its peak 359 -> 369-375 MiB.
# bench_scaling.py's realistic shapes, one run each (before that merge change): 65 MB 0.98 ->
# 0.77 s, 163 MB 1.17 -> 1.08 s, 507 MB 2.21 -> 2.00 s, 1,509 MB 7.52 -> 5.81 s; peaks 188 ->
# 190, 212 -> 224, 293 -> 325, 636 -> 638 MiB; with it, kept, 189, 223, 356 and 640 MiB: within
# the bound at every size.
_KINETO_KEPT = "dirty_decay_ms:10,muzzy_decay_ms:0,narenas:1"
_KEPT_PEAK = 1.2  # at most this times the peak of returning them at once (the estimate's)


def _allocator_setting(args: argparse.Namespace) -> str:
    """Polars' allocator setting for this command: freed pages kept a while (``_EXPORT_KEPT``,
    ``_KINETO_KEPT``) where every input is an Nsight Systems export, or every one a Kineto
    trace, whose analysis leaves the room under the memory budget that kept pages may take
    (``_room_for_kept``: estimated before polars starts, from an export's tables' rows,
    ``readers._export_rows``, and from a Kineto trace's size, ``readers._kineto_size``);
    else returned at once (``_AT_ONCE``): inputs of both kinds, folders and run directories
    (not looked into), files neither reader takes."""
    if getattr(args, "func", None) not in (cmd_analyze, cmd_sql, cmd_compare, cmd_report):
        return _AT_ONCE
    paths = args.paths if args.func is not cmd_sql else [args.trace]
    budget = args.memory_budget
    chosen = getattr(args, "steps", None) is not None or getattr(args, "window", None) is not None
    kinds = set()
    for p in paths:
        got = _whole_need(Path(p)) if p is not None and os.path.isfile(p) else None
        if got is None or not _room_for_kept(got[1], budget, chosen, part=got[0] == "export"):
            return _AT_ONCE
        kinds.add(got[0])
    if kinds == {"export"}:
        return _EXPORT_KEPT
    return _KINETO_KEPT if kinds == {"kineto"} else _AT_ONCE


def _room_for_kept(need: int, budget: int | None, chosen: bool, part: bool = True) -> bool:
    """Whether kept freed pages fit the budget (``_allocator_setting``): ``need``, the estimated
    peak of a whole read; ``chosen``, a part the user chose (read as chosen, whatever the
    budget). A whole read fits where ``need`` times ``_KEPT_PEAK`` does; with ``part`` (an
    export), so does one over the budget, read in a part the budget plans (no ``--steps`` /
    ``--window``): the part fills ``PART_MARGIN`` of what the budget leaves beyond the fixed
    cost, which leaves the room whenever the budget is at least six times the fixed cost (960
    MB). The 1048 MB export within the default budget (a part of 77 % of its events):
    13.6-14.7 -> 12.3-13.2 s, 1,135 -> 1,226-1,233 MiB."""
    from proflab.readers._export_rows import COST_FIXED, PART_MARGIN

    if budget is None or need * _KEPT_PEAK <= budget:
        return True
    planned = COST_FIXED + PART_MARGIN * (budget - COST_FIXED)  # the peak a part is planned to
    return part and not chosen and need > budget > COST_FIXED and planned * _KEPT_PEAK <= budget


def _whole_need(path: Path) -> tuple[str, int] | None:
    """("export" or "kineto", the estimated peak in bytes of reading and analysing ``path``
    whole), without polars; None where it is neither an export that opens nor a file the
    Kineto reader would take."""
    from proflab.readers import _export_rows, _kineto_size

    if _export_rows.sniff(path):
        whole = _export_rows.whole_bytes(path)
        return None if whole is None else ("export", whole[1])
    if path.suffix == ".nsys-rep" or not _kineto_size.looks_like_kineto(path):
        return None
    try:
        return "kineto", _kineto_size.need(path)
    except OSError:
        return None


def _one_blas_thread() -> None:
    """numpy's OpenBLAS starts a thread per core when numpy is imported, and they spin a while
    waiting for work that analysis never gives them (its only BLAS call is a line fit over a
    few points): 0.2 CPU s of a 2-core machine's 3 s analysis of a 500 MB trace, in the reader's
    helper process too. Only for the commands that analyse files, never over the user's own
    setting, and a program that proflab runs gets the user's environment (``_env``)."""
    if "numpy" not in sys.modules and "OPENBLAS_NUM_THREADS" not in os.environ:
        from proflab._env import set_own

        set_own("OPENBLAS_NUM_THREADS", "1")


def _map_large_blocks() -> None:
    """numpy's arrays come from the C library's heap: a fixed mapping threshold, and its free
    memory given back as each analysis table is built (``proflab._heap``)."""
    from proflab import _heap

    _heap.fix_threshold()


# what polars 1.x puts first (1.37: "dirty_decay_ms:500,muzzy_decay_ms:1000"; earlier 1.x: -1),
# with POLARS_THP=1 its transparent-huge-page options, then "," and the setting it found
_POLARS_MALLOC_DEFAULT = re.compile(r"^dirty_decay_ms:500,muzzy_decay_ms:-?\d+(?:,thp:always,metadata_thp:always)?(?:,|$)")


def entry() -> None:
    """The ``proflab`` command: :func:`main` over ``sys.argv``, then the process ends without
    tearing the interpreter down (:func:`_end`)."""
    _end(main())


def _end(status: int | None) -> None:
    """End the process with ``status`` once the command is done: what ``sys.exit`` does, less
    the interpreter's teardown of every module (polars, numpy and the rest: 80-95 ms of every
    command on 2 cores, 0.84 s in all for a small trace's analysis). The atexit functions still
    run (temporary folders, helper processes, logging) and stdout and stderr are flushed; the
    usual exit where a thread that is not a daemon is still running, or atexit is not what
    CPython's is."""
    import atexit
    import threading

    run_exit_functions = getattr(atexit, "_run_exitfuncs", None)
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if others or run_exit_functions is None:
        sys.exit(status)
    run_exit_functions()
    code = status or 0
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (BrokenPipeError, ValueError):  # the reader went away (`| head`), or it was closed
            pass
        except OSError:
            code = code or 1
    os._exit(code & 0xFF)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # everything after "--" is the program to run, never proflab's options
    trailing: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, trailing = argv[:i], argv[i + 1 :]
    args = parser.parse_args(argv)
    args.trailing = trailing
    _return_freed_memory(_allocator_setting(args))
    if getattr(args, "func", None) in (cmd_analyze, cmd_sql, cmd_compare, cmd_report, cmd_baseline):
        _one_blas_thread()
        _map_large_blocks()
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except ProflabError as e:
        from proflab.render._text import printable

        # one line, whatever a file name or a trace put into the message
        print(f"proflab: error: {printable(str(e)).replace(chr(10), ' ')}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("proflab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from proflab.readers import expand_paths
    from proflab.render import format_for_path

    paths = expand_paths(args.paths)
    fmt = args.format or (format_for_path(args.output) if args.output else None) or "term"
    load = _loader(args, show_progress=fmt == "term")
    if args.output:
        out = Path(args.output).resolve()
        if any(out == p.resolve() for p in paths):
            raise UsageError(f"{args.output}: refusing to overwrite an input trace")
    if args.top < 0:
        raise UsageError("--top must be >= 0")
    _check_perfetto(args, paths)
    if args.all_parts:
        return _analyze_all_parts(args, paths, fmt)
    if _is_html(args.output):  # the single-file HTML report, as `proflab report` writes it
        return _write_html(args)
    ncu_dir = Path(args.paths[0]) / "ncu" if len(args.paths) == 1 and Path(args.paths[0]).is_dir() else None
    if ncu_dir is not None and (ncu_dir / "raw.csv").exists():
        # a run directory with `proflab kernels` results: both levels, ranked together
        from proflab.report.deepdive import deep_dive
        from proflab.readers.ncu import load as load_ncu

        pages = [ncu_dir / "raw.csv"] + ([ncu_dir / "details.csv"] if (ncu_dir / "details.csv").exists() else [])
        traces = [load(p) for p in paths]
        reports = [deep_dive(load_ncu(pages), t, top_kernels=args.top) for t in traces]
        if args.perfetto:
            _emit_perfetto(args, traces[0], reports[0])
    elif len(paths) >= 2 and args.job or args.scheduler or args.workers:
        return _emit_reports(args, _job_or_reports(args, paths), fmt)
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
            return _emit_reports(args, reports, fmt)
        from proflab.report.analyze import analyze

        traces = [load(p) for p in paths]
        if len(traces) == 1 and args.job and traces[0].meta.format != "kineto":
            # an Nsight Systems export of a whole job holds every rank's process
            from proflab.report.job import analyze_processes

            job = analyze_processes(traces[0], top_kernels=args.top, bare_step_ms=args.bare_step_ms)
            if job is not None:
                if args.perfetto:
                    raise UsageError(f"{paths[0]}: holds several ranks' processes; --perfetto marks one process's trace")
                return _emit_reports(args, job, fmt)
        with _analysing(fmt == "term"):
            reports = [r or analyze(t, top_kernels=args.top, bare_step_ms=b) for r, t, b in zip(reports, traces, bare)]
        for k, r in zip(keys, reports):
            report_cache.put(k, r)
        if args.perfetto:
            _emit_perfetto(args, traces[0], reports[0])
        return _emit_reports(args, reports, fmt, traces=traces)
    return _emit_reports(args, reports, fmt)


def _refuse_parts_with(args: argparse.Namespace) -> None:
    """--all-parts takes every event: not with an option that takes a part, nor --perfetto."""
    for clash, given in (("--steps", args.steps), ("--window", args.window), ("--perfetto", getattr(args, "perfetto", None))):
        if given:
            raise UsageError(f"--all-parts analyses every event of a trace; it takes no {clash} (analyse a part without --all-parts)")


def _analyze_all_parts(args: argparse.Namespace, paths: list[Path], fmt: str) -> int:
    """``analyze --all-parts``: each trace's report of every event (``report.combine``),
    from the report cache when analysed before with the same options."""
    from proflab.collect.rundir import unprofiled_step_ms
    from proflab.report import cache as report_cache

    _refuse_parts_with(args)
    if _is_html(args.output):  # the single-file HTML report of every event
        return _write_html(args)
    from proflab.report.analyze import analyze

    reports = []
    for p in paths:
        bare = args.bare_step_ms or unprofiled_step_ms(p)
        options = {"top": args.top, "all_parts": True, "memory_budget": args.memory_budget, "bare_step_ms": bare}
        key = report_cache.key(p, options, args.cache)
        report = report_cache.get(key)
        if report is None:
            _warn_if_too_big(Path(p), args.memory_budget)
            with _analysing(fmt == "term") as status:
                on_part = _parts_shown(status, Path(p).name)
                report = analyze(p, top_kernels=args.top, bare_step_ms=bare, all_parts=True, memory_budget=args.memory_budget,
                                 cache=args.cache, on_part=on_part)
            report_cache.put(key, report)
        reports.append(report)
    # (a run directory's energy is read from its traces' windows and steps: they would be read
    # again, whole or in a part, past the budget the parts held; `proflab energy` reads them)
    return _emit_reports(args, reports, fmt, energy_skipped="not with --all-parts: proflab energy RUN_DIR analyses it")


_NPROC = re.compile(r"^--nproc[-_]per[-_]node(?:=(.*))?$")


def _scaling_command(cmd: list[str], gpus: int) -> list[str]:
    """``cmd`` for one GPU count: its ``{gpus}`` placeholders, else its torchrun
    ``--nproc_per_node`` value, set to ``gpus``."""
    if any("{gpus}" in a for a in cmd):
        return [a.replace("{gpus}", str(gpus)) for a in cmd]
    out, i, found = [], 0, False
    while i < len(cmd):
        m = _NPROC.match(cmd[i])
        if m and m.group(1) is not None:
            out.append(cmd[i].split("=", 1)[0] + f"={gpus}")
            found = True
        elif m and i + 1 < len(cmd):
            out += [cmd[i], str(gpus)]
            i += 1
            found = True
        else:
            out.append(cmd[i])
        i += 1
    if not found:
        raise UsageError("--gpus: the command needs a {gpus} placeholder or torchrun's --nproc_per_node to set the GPU count")
    return out


def _launch_scaling_runs(args: argparse.Namespace) -> list[str]:
    """Run the command under ``proflab run`` once per GPU count (fewest first); the run
    directories, for the scaling comparison."""
    from proflab.collect import rundir
    from proflab.collect.launcher import RunOptions, run

    if not args.gpus or not args.trailing:
        raise UsageError("--gpus needs GPU counts and the command after --, e.g. --gpus 1,2 -- torchrun --nproc_per_node {gpus} train.py")
    try:
        counts = sorted({int(x) for x in args.gpus.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--gpus {args.gpus!r}: comma-separated GPU counts, e.g. 1,2,4") from None
    if len(counts) < 2 or counts[0] < 1:
        raise UsageError("--gpus needs at least two GPU counts, each >= 1")
    cmds = {n: _scaling_command(args.trailing, n) for n in counts}
    root = Path(args.runs_dir or rundir.DEFAULT_ROOT)
    batch = rundir.new_run_dir(root, "scaling")
    runs = []
    for n in counts:
        print(f"proflab scaling: {n} GPU(s): {' '.join(cmds[n])}", file=sys.stderr, flush=True)
        rc = run(cmds[n], RunOptions(root=str(batch), name=f"{n}gpu", **_recording_options(args), analyze=False), out=sys.stderr)
        made = sorted(p for p in batch.iterdir() if p.is_dir() and p.name.endswith(f"-{n}gpu"))
        if rc != 0 or not made:
            raise UsageError(f"the run at {n} GPU(s) exited with status {rc}: its run directory is {made[-1] if made else batch}")
        runs.append(str(made[-1]))
    return runs


def cmd_scaling(args: argparse.Namespace) -> int:
    from proflab.report.scaling import point_of, profiler_notes, scaling_rows
    from proflab.render import format_for_path
    from proflab.report import ScalingReport

    if args.gpus is not None or args.trailing:
        if args.runs:
            raise UsageError("give either runs to compare or --gpus with a command after --, not both")
        args.runs = _launch_scaling_runs(args)
    else:
        defaults = _recording_defaults()
        given = [k for k, v in _recording_options(args).items() if v != defaults[k]]
        if given:
            raise UsageError(f"what is recorded ({', '.join(given)}) applies to the runs --gpus launches; these runs are recorded already")
    if len(args.runs) < 2:
        raise UsageError("scaling needs at least two runs (at different GPU counts)")
    if args.plot and not args.plot.endswith((".png", ".svg", ".pdf")):
        raise UsageError(f"{args.plot}: --plot writes .png, .svg or .pdf")
    fmt = args.format or (format_for_path(args.output) if args.output else None) or "term"
    points = []
    for run in args.runs:
        from proflab.report import job as jobs
        from proflab.report.analyze import analyze
        from proflab.readers import expand_paths

        paths = expand_paths([run])
        if len(paths) == 1:
            from proflab.collect.rundir import unprofiled_step_ms

            # a run directory's one process: proflab run timed its steps outside the window
            bare = unprofiled_step_ms(paths[0])
            rep = analyze(paths[0], bare_step_ms=bare)
        else:
            try:
                rep = jobs.analyze_job(paths)
            except jobs.NotAJob as e:
                raise UsageError(f"{run}: not one job's rank traces ({e})") from None
            bare = None
        points.append(point_of(run, rep, bare_step_ms=bare))
    gpus = [p.gpus for p in points]
    if len(set(gpus)) < 2:
        raise UsageError(f"the runs are all at {gpus[0]} GPU(s): scaling needs at least two GPU counts")
    notes = []
    if min(gpus) != 1:
        notes.append(f"the base is the run with {min(gpus)} GPUs, not 1: efficiencies are relative to it")
    rows = scaling_rows(points, args.mode)
    rep = ScalingReport(args.mode, tuple(rows), tuple(notes + profiler_notes(rows)))
    if args.plot:
        from proflab.render.scaling import plot_scaling

        with atomic_path(Path(args.plot)) as tmp:
            plot_scaling(rep, tmp, Path(args.plot).suffix[1:])
    if fmt == "json":
        import json

        text = json.dumps(rep.to_dict(), indent=2) + "\n"
    else:
        from proflab.render.scaling import render_scaling

        text = render_scaling(rep, fmt)
    return _write_out(args, text)


def _job_or_reports(args: argparse.Namespace, paths: list[Path]):
    """The job report when the traces are the ranks of one job (each names its rank, once);
    else each trace's own report (the rank tasks' reports: nothing is read twice)."""
    from proflab.report import job as jobs

    if args.workers is not None and args.workers < 1:
        raise UsageError("--workers must be >= 1")
    try:
        return jobs.analyze_job(
            paths, scheduler=args.scheduler, workers=args.workers, top_kernels=args.top,
            bare_step_ms=args.bare_step_ms, **_reading(args),
        )
    except jobs.NotAJob as e:
        if args.scheduler or args.workers:
            raise UsageError(str(e)) from None
        return [s.report for s in e.summaries]


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
    if out_dir is not None:
        _write_atomic(out_dir / "kernels.json", render([report], "json", width=80, color=False))
    return _emit_reports(args, [report], fmt)


def cmd_run(args: argparse.Namespace) -> int:
    from proflab.collect.launcher import RunOptions, run

    # main() takes everything after the first "--" as args.trailing
    cmd = list(args.cmd) + (["--"] if args.cmd and args.trailing else []) + args.trailing
    to_tty = sys.stdout.isatty()
    opts = RunOptions(
        root=args.out, name=args.name, **_recording_options(args), analyze=args.analyze, top=args.top,
        width=args.width or (min(os.get_terminal_size().columns, 100) if to_tty else 80),
        color=args.color == "always" or (args.color == "auto" and to_tty and "NO_COLOR" not in os.environ),
    )  # fmt: skip
    return run(cmd, opts)


# -- report and demo: the single-file HTML report ------------------------------------------


def _report_parser(sub) -> None:
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
    _perfetto_arg(r)
    _reading_args(r).add_argument(
        "--all-parts", action="store_true",
        help="a trace over --memory-budget: the page of every event, analysed in consecutive parts that each fit (as "
             "analyze --all-parts; the timeline combined from the parts'), instead of a part from its middle",
    )
    r.set_defaults(func=cmd_report)


def _is_html(output: str | None) -> bool:
    return bool(output) and output.lower().endswith((".html", ".htm"))


def _fresh_path(stem: str, suffix: str, folder: Path = Path(".")) -> Path:
    """``folder/stem.suffix``, or ``stem-2.suffix``, ... : a name that holds no file yet."""
    for i in range(1, 10_000):
        p = folder / (f"{stem}{suffix}" if i == 1 else f"{stem}-{i}{suffix}")
        if not p.exists():
            return p
    raise UsageError(f"{folder}: no free name for {stem}{suffix}")


def _write_html(args: argparse.Namespace) -> int:
    """The HTML report of ``args.paths`` to ``args.output`` (atomically)."""
    from proflab.cli.page import html_report

    all_parts = getattr(args, "all_parts", False)
    with _analysing(all_parts) as status:
        html = html_report(args.paths, load=_loader(args), top_kernels=args.top, bare_step_ms=args.bare_step_ms, job=args.job,
                           cache=_reading(args), all_parts=all_parts, on_part=_parts_shown(status))
    _write_atomic(Path(args.output), html)
    if getattr(args, "perfetto", None):  # the marked trace beside the page (one trace: _check_perfetto)
        from proflab.report.analyze import analyze
        from proflab.collect.rundir import unprofiled_step_ms
        from proflab.readers import expand_paths

        (path,) = expand_paths(args.paths)
        trace = _loader(args)(path)
        bare = args.bare_step_ms or unprofiled_step_ms(path)
        _emit_perfetto(args, trace, analyze(trace, top_kernels=args.top, bare_step_ms=bare))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from proflab.readers import expand_paths

    paths = expand_paths(args.paths)
    if args.top < 0:
        raise UsageError("--top must be >= 0")
    if args.output is None:
        args.output = str(_fresh_path("proflab-report", ".html"))
    elif not _is_html(args.output):
        raise UsageError(f"{args.output}: the report is an HTML page; name it .html")
    out = Path(args.output).resolve()
    if any(out == p.resolve() for p in paths):
        raise UsageError(f"{args.output}: refusing to overwrite an input trace")
    if args.all_parts:
        _refuse_parts_with(args)
    _check_perfetto(args, paths)
    _write_html(args)
    print(f"proflab: HTML report written to {args.output}", file=sys.stderr)
    return 0


def _demo_parser(sub) -> None:
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
        _write_atomic(out, html_report([trace_path], load=lambda p: trace, bare_step_ms=bare_ms, title="proflab demo"))
    print(f"\nHTML report: {out.resolve()}")
    return 0


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
    sys.stdout.write(_frame_text(df, width=width, limit=None))
    return 0


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
    load = _loader(args, show_progress=fmt == "term")
    unprofiled = tuple(_step_times(f) for f in args.unprofiled_steps) if args.unprofiled_steps else None
    if unprofiled is None:
        # two `proflab run` directories carry the step times measured outside their windows
        from proflab.collect.rundir import unprofiled_steps_ms

        measured = [unprofiled_steps_ms(p) for p in sides]
        unprofiled = tuple(measured) if all(m is not None for m in measured) else None
    if args.all_parts:
        _refuse_parts_with(args)
    with _analysing(args.all_parts and fmt == "term") as status:
        comparison = compare(sides[0], sides[1], threshold_pct=args.threshold, top_kernels=args.top, load_trace=load,
                             unprofiled_steps_ms=unprofiled, all_parts=args.all_parts, on_part=_parts_shown(status), **_reading(args))
    _emit_reports(args, comparison, fmt)
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


def cmd_sql(args: argparse.Namespace) -> int:
    fmt = args.format
    if args.output and not fmt:
        fmt = _SQL_SUFFIX.get(Path(args.output).suffix.lower())
        if fmt is None:
            raise UsageError(f"{args.output}: cannot tell the format from the suffix; pass -f {'|'.join(SQL_FORMATS)}")
    fmt = fmt or "table"
    if fmt == "parquet" and not args.output:
        raise UsageError("parquet output needs -o FILE")
    if args.limit is not None and args.limit < 0:
        raise UsageError("--limit must be >= 0")
    if args.output and args.trace and Path(args.output).resolve() == Path(args.trace).resolve():
        raise UsageError(f"{args.output}: refusing to overwrite the input trace")

    text = _cached_sql_text(args, fmt)
    if text is not None:
        return _write_out(args, text)
    from proflab import sql

    read = _loader(args, show_progress=fmt == "table")

    def load(p):  # a query's rows carry no notes: a part read for the budget is said on stderr
        trace = read(p)
        if trace.meta.budget is not None:
            from proflab.render._text import printable

            said = next((n for n in trace.meta.notes if n.startswith("memory budget: reading")), "")
            print(f"proflab: {printable(said.split('. A larger', 1)[0])}; the query sees that part", file=sys.stderr)
        return trace

    # a folder or run directory of several rank traces: the job's tables
    ranks = None
    if args.trace and Path(args.trace).is_dir():
        from proflab.readers import expand_paths

        found = expand_paths([args.trace])
        if args.output and any(Path(args.output).resolve() == f.resolve() for f in found):
            raise UsageError(f"{args.output}: refusing to overwrite an input trace")
        ranks, args.trace = (found, None) if len(found) >= 2 else (None, str(found[0]))
    reading = _reading(args)
    if args.tables:
        if args.query:
            raise UsageError("--tables takes no query")
        if ranks:
            df = sql.job_catalog(ranks, **reading)
        elif args.trace:
            df = sql.catalog(load(args.trace))
        else:
            import polars as pl

            df = pl.concat([sql.catalog(), sql.job_catalog()])
        if fmt == "table":
            return _write_out(args, _catalog_text(df, _sql_width(args)))
        return _emit_frame(args, df, fmt)
    if not (args.trace or ranks) or not args.query:
        raise UsageError('give a trace and a query: proflab sql TRACE "SELECT ..." (or --tables)')
    df = None if ranks or args.steps or args.window else sql.query_cached(args.trace, args.query, cache=args.cache)
    if df is None:
        df = sql.query_job(ranks, args.query, **reading) if ranks else sql.query(args.trace, args.query, load=load)
    limit = args.limit if args.limit is not None else (_TABLE_ROWS if fmt == "table" else 0)
    if fmt == "table":
        return _write_out(args, _frame_text(df, width=_sql_width(args), limit=limit or None))
    return _emit_frame(args, df.head(limit) if limit else df, fmt)


def _sql_width(args: argparse.Namespace) -> int:
    if args.width:
        return args.width
    return os.get_terminal_size().columns if not args.output and sys.stdout.isatty() else 80


def _catalog_text(df, width: int) -> str:
    """Each table: its name, row count and description, then its columns wrapped to ``width``."""
    import textwrap

    lines = []
    for (table,), cols in df.group_by("table", maintain_order=True):
        rows = cols["rows"][0]
        head = f"{table}" + (f" ({rows} row{'s' if rows != 1 else ''})" if rows is not None else "")
        lines.extend(textwrap.wrap(f"{head}: {cols['description'][0]}", width=width, subsequent_indent="    "))
        # \0 keeps each "column TYPE" pair on one line; types may hold spaces too.
        spec = ", ".join(f"{c}\0{t.replace(' ', chr(0))}" for c, t in zip(cols["column"], cols["type"]))
        wrapped = textwrap.wrap(spec, width=width, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False)
        lines.extend(line.replace("\0", " ") for line in wrapped)
        lines.append("")
    return "\n".join(lines)


def _flat(df):
    """Nested columns (lists, structs) as JSON text: for CSV and the terminal."""
    import polars as pl

    nested = [c for c, t in df.schema.items() if t.is_nested()]
    return df.with_columns(
        pl.when(pl.col(c).is_not_null())
        .then(pl.struct(pl.col(c).alias("v")).struct.json_encode().str.slice(5).str.strip_suffix("}"))
        .alias(c)
        for c in nested
    )


def _cells(values: list, *, is_float: bool) -> list[str]:
    """One column's values as text; floats share one format so that the points line up."""
    import math

    from proflab.render._text import printable

    finite = [v for v in values if isinstance(v, float) and math.isfinite(v)]
    fmt = "{:.3f}"
    if is_float and finite:
        if all(v == int(v) for v in finite) and max(abs(v) for v in finite) < 1e15:
            fmt = "{:.0f}"
        elif max(abs(v) for v in finite) >= 1e15 or max(abs(v) for v in finite) < 1e-3:
            fmt = "{:.4g}"

    def cell(v) -> str:
        if v is None:
            return "null"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            return fmt.format(v) if math.isfinite(v) else str(v)
        # no line breaks inside a row, and a name's escape sequences shown, not obeyed
        return printable(" ".join(str(v).split()))

    return [cell(v) for v in values]


def _frame_text(df, *, width: int, limit: int | None) -> str:
    """A result as a plain table in ``width`` columns: the leading columns that fit, at most
    ``limit`` rows, and a note saying what was left out and how to get it."""
    if df.width == 0:
        return "(the statement returned no result)\n"
    shown = _flat(df.head(limit) if limit else df)
    return _table_text(shown.columns, [t.is_numeric() for t in shown.dtypes],
                       {c: _cells(shown[c].to_list(), is_float=t.is_float()) for c, t in shown.schema.items()},
                       shown.height, df.height, width)


def _table_text(columns: list[str], numeric: list[bool], cells: dict[str, list[str]], height: int, total: int, width: int) -> str:
    """The table of ``_frame_text`` from its columns' text (``_cells``): ``height`` rows shown
    of ``total``. Needs no polars (``proflab sql`` from the cache uses it directly)."""
    import io
    import textwrap

    from rich import box
    from rich.cells import cell_len
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from proflab.render._text import printable

    right = dict(zip(columns, numeric))
    console = Console(width=width, file=io.StringIO(), color_system=None, highlight=False)

    def table(cols: list[str]) -> Table:
        t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="")
        for c in cols:
            t.add_column(Text(printable(c)), justify="right" if right[c] else "left", no_wrap=True, overflow="ellipsis", max_width=_MAX_CELL)
        for i in range(height):
            t.add_row(*(Text(cells[c][i]) for c in cols))
        return t

    # The leading columns that fit at their natural width (3 cells between columns).
    cols: list[str] = []
    used = -_GUTTER
    for c in columns:
        natural = min(max(cell_len(x) for x in [printable(c), *cells[c]]), _MAX_CELL)
        if cols and used + _GUTTER + natural > width:
            break
        cols.append(c)
        used += _GUTTER + natural
    console.print(table(cols))
    notes = [f"{total} row{'s' if total != 1 else ''}" if height == total else
             f"{height} of {total} rows shown (--limit N; 0 for all; -f csv, json or parquet writes all)"]
    hidden = columns[len(cols):]
    if hidden:
        notes.append(f"{len(hidden)} more column{'s' if len(hidden) != 1 else ''} not shown: {', '.join(hidden)}")
    text = "".join(line.rstrip() + "\n" for line in console.file.getvalue().splitlines())
    for note in notes:
        text += "\n".join(textwrap.wrap(note, width=width, subsequent_indent="  ", break_on_hyphens=False)) + "\n"
    return text


def _cached_sql_text(args: argparse.Namespace, fmt: str) -> str | None:
    """The terminal table of a query over a cached trace's own tables, by DuckDB alone
    (``_sqlfast``: no polars); None when that path cannot answer it."""
    if fmt != "table" or args.tables or not args.trace or not args.query or args.steps or args.window or Path(args.trace).is_dir():
        return None
    from proflab import _sqlfast

    limit = args.limit if args.limit is not None else _TABLE_ROWS
    r = _sqlfast.cached_result(args.trace, args.query, cache=args.cache, limit=limit or None)
    if r is None:
        return None
    if not r.columns:
        return "(the statement returned no result)\n"
    cells = {c: _cells([row[i] for row in r.rows], is_float=f) for i, (c, f) in enumerate(zip(r.columns, r.floats))}
    return _table_text(r.columns, r.numeric, cells, len(r.rows), r.total, _sql_width(args))


def _emit_frame(args: argparse.Namespace, df, fmt: str) -> int:
    """CSV, JSON (an array of row objects) or Parquet: every row given, to -o or stdout."""
    if fmt == "parquet":
        with _output_file(Path(args.output)) as tmp:
            df.write_parquet(tmp)
        return 0
    if fmt == "csv":
        text = _flat(df).write_csv()
    else:
        text = df.write_json() + "\n"
    return _write_out(args, text)


def _write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a crash never leaves half a report."""
    with _output_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


@contextlib.contextmanager
def _output_file(path: Path):
    """``atomic_path`` for an output the user named: a place that cannot be written (a
    directory, no permission, a full disk, a name too long) is one line and exit 2, and what
    was there before stays as it was."""
    try:
        if path.is_dir():
            raise UsageError(f"{path}: is a directory; give -o a file name")
        with atomic_path(path) as tmp:
            yield tmp
    except OSError as e:
        raise UsageError(f"{path}: cannot write there ({e.strerror or e})") from e
