"""``proflab memory``: GPU memory over a trace's window, or in a memory snapshot; a plot."""

from __future__ import annotations

import argparse
from pathlib import Path

from proflab.cli._common import format_arg, output_file, write_out
from proflab.errors import UsageError

__all__ = ["add_parsers", "cmd_memory"]


def add_parsers(sub) -> None:
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
    format_arg(me)
    me.add_argument("-o", "--output", metavar="FILE", help="a plot (.png, .svg) or the section (.json, .md, .txt), atomically")
    me.set_defaults(func=cmd_memory)


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
        return write_out(args, render_memory(m, fmt))
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
        with output_file(Path(args.output)) as tmp:
            plot_memory(a, tmp, fmt=Path(args.output).suffix.lower()[1:])
        return 0
    return write_out(args, render_memory(a.to_dict(), fmt, findings=findings))
