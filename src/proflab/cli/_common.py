"""What the commands share: the output options and where the output goes (atomically), the
rendering of reports, the marked Perfetto trace, the spinner while traces are analysed,
and the HTML page of ``analyze -o x.html`` and ``report``."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

from proflab._io import atomic_path
from proflab._timings import phase
from proflab.cli._reading import loader, reading_options
from proflab.errors import ProflabError, UsageError


def format_arg(p) -> None:
    """The -f/--format option of the commands that write a report: term, json or md."""
    p.add_argument("-f", "--format", choices=("term", "json", "md"), help="output format (default: term, or from -o suffix)")


def report_output_args(p: argparse.ArgumentParser) -> None:
    """-f/-o/--width/--color of the commands that print a Report (analyze, kernels)."""
    format_arg(p)
    p.add_argument("-o", "--output", metavar="FILE", help="write the report here (atomically) instead of stdout")
    p.add_argument("--width", type=int, default=None, metavar="COLS", help="terminal width (default: the terminal's, at most 100)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto", help="colour in terminal output")


def write_out(args: argparse.Namespace, text: str) -> int:
    """``text`` to -o (atomically) or stdout."""
    if args.output:
        write_atomic(Path(args.output), text)
    else:
        sys.stdout.write(text)
    return 0


def write_atomic(path: Path, text: str, *, say: bool = True) -> None:
    """Write via a temporary file and rename, so a crash never leaves half a report."""
    with output_file(path, say=say) as tmp:
        tmp.write_text(text, encoding="utf-8")


@contextlib.contextmanager
def output_file(path: Path, *, say: bool = True):
    """``atomic_path`` for an output the user named: a place that cannot be written (a
    directory, no permission, a full disk, a name too long) is one line and exit 2, and what
    was there before stays as it was. Once written, one line on stderr says where and how
    large (``say``), so that a command run with -o never finishes in silence."""
    try:
        if path.is_dir():
            raise UsageError(f"{path}: is a directory; give -o a file name")
        with atomic_path(path) as tmp:
            yield tmp
    except OSError as e:
        raise UsageError(f"{path}: cannot write there ({e.strerror or e})") from e
    if say:
        said_written(path)


def said_written(path: Path, what: str = "") -> None:
    """``proflab: wrote report.html (912.4 KB)`` on stderr (stdout stays the output's)."""
    try:
        size = _size_text(Path(path).stat().st_size)
    except OSError:  # written and then gone (another process): say where it went all the same
        size = "size unknown"
    print(f"proflab: wrote {what + ' ' if what else ''}{path} ({size})", file=sys.stderr)


def _size_text(n_bytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:,.1f} {unit}"
    return f"{n_bytes} bytes"


def is_html(output: str | None) -> bool:
    return bool(output) and output.lower().endswith((".html", ".htm"))


def emit_reports(args: argparse.Namespace, reports: list, fmt: str, *, traces: list | None = None,
                 energy_skipped: str | None = None) -> int:
    """Render ``reports`` as ``fmt`` to -o (atomically) or stdout; for ``analyze`` of a run
    directory with GPU monitor samples, its energy section follows (terminal and Markdown),
    or with ``energy_skipped``, why it does not."""
    with phase("render"):
        from proflab.render import render

        if is_html(args.output):  # compare or kernels -o x.html: the page of these reports
            from proflab.render.html import render_html

            return write_out(args, render_html(reports))
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
        return write_out(args, text)


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


def perfetto_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--perfetto", metavar="OUT.json", help=(
        "also write the trace with the findings marked on it (idle gaps by cause, findings, GPU-side steps, "
        "GPU busy and monitor power counters) for ui.perfetto.dev or chrome://tracing; gzip when OUT ends .gz, xz when .xz"))


def check_perfetto(args: argparse.Namespace, paths: list) -> None:
    """--perfetto: one trace, never written over an input."""
    if not getattr(args, "perfetto", None):
        return
    if len(paths) != 1:
        raise UsageError(f"--perfetto marks one trace; {len(paths)} were given")
    if not args.perfetto.endswith((".json", ".json.gz", ".json.xz")):
        raise UsageError(f"{args.perfetto}: --perfetto writes Trace Event Format JSON: name it .json, .json.gz or .json.xz")
    out = Path(args.perfetto).resolve()
    if any(out == Path(p).resolve() for p in [*paths, *args.paths]):
        raise UsageError(f"{args.perfetto}: refusing to overwrite an input trace")
    if args.output and Path(args.output).resolve() == out:
        raise UsageError(f"{args.perfetto}: --perfetto and -o name the same file")


def emit_perfetto(args: argparse.Namespace, trace, report) -> None:
    """Write --perfetto (a run directory's monitor.parquet gives the power counters)."""
    if not getattr(args, "perfetto", None):
        return
    from proflab.render.perfetto import write_perfetto

    monitor = Path(args.paths[0]) / "monitor.parquet" if len(args.paths) == 1 and Path(args.paths[0]).is_dir() else None
    sliced = bool(getattr(args, "steps", None) or getattr(args, "window", None))
    write_perfetto(trace, report, args.perfetto, monitor=monitor, keep_original=not sliced)
    print(f"proflab: marked trace written to {args.perfetto} (open it in ui.perfetto.dev)", file=sys.stderr)


def refuse_parts_with(args: argparse.Namespace) -> None:
    """--all-parts takes every event: not with an option that takes a part, nor --perfetto."""
    for clash, given in (("--steps", args.steps), ("--window", args.window), ("--perfetto", getattr(args, "perfetto", None))):
        if given:
            raise UsageError(f"--all-parts analyses every event of a trace; it takes no {clash} (analyse a part without --all-parts)")


def analysing(show: bool):
    """A spinner on a terminal's stderr while the read traces are analysed (seconds on a large
    one, after the read's own bar has gone); nothing in a pipe or for JSON and Markdown."""
    if not (show and sys.stderr.isatty()):
        return contextlib.nullcontext()
    from rich.console import Console

    return Console(stderr=True).status("analysing", spinner="dots")


def parts_shown(status, name: str | None = None):
    """The ``on_part(n, label)`` that shows on the spinner (``analysing``'s, or None) which
    part of a trace analysed in parts is being analysed."""
    def on_part(n: int, label: str) -> None:
        if status is not None:
            status.update(f"analysing {name + ': ' if name else ''}part {n} ({label})")

    return on_part


def write_html(args: argparse.Namespace) -> int:
    """The HTML report of ``args.paths`` to ``args.output`` (atomically), and the roofline of
    its reports where ``analyze --roofline`` asks for it."""
    from proflab.cli.page import html_report

    all_parts = getattr(args, "all_parts", False)
    shown: list = []
    with analysing(all_parts) as status:
        html = html_report(args.paths, load=loader(args), top_kernels=args.top, bare_step_ms=args.bare_step_ms, job=args.job,
                           cache=reading_options(args), all_parts=all_parts, on_part=parts_shown(status), shown=shown)
    write_atomic(Path(args.output), html)
    if shown:
        write_operator_roofline(args, shown[0])
    if getattr(args, "perfetto", None):  # the marked trace beside the page (one trace: check_perfetto)
        from proflab.report.analyze import analyze
        from proflab.collect.rundir import unprofiled_step_ms
        from proflab.readers import expand_paths

        (path,) = expand_paths(args.paths)
        trace = loader(args)(path)
        bare = args.bare_step_ms or unprofiled_step_ms(path)
        emit_perfetto(args, trace, analyze(trace, top_kernels=args.top, bare_step_ms=bare))
    return 0


def write_operator_roofline(args: argparse.Namespace, reports) -> None:
    """--roofline: the first report's operators (and its Nsight Compute kernels) as an SVG;
    said on stderr when no report has the operators it draws. (``proflab report`` has no
    --roofline: its pages are written alone.)"""
    if not getattr(args, "roofline", None):
        return
    from proflab.render.perf import roofline_svg

    reps = list(getattr(reports, "reports", reports))
    rep = next((r for r in reps if getattr(r, "perf", None)), None)
    if rep is None:
        print("proflab: --roofline: not written: the trace records no framework operators", file=sys.stderr)
        return
    with output_file(Path(args.roofline)) as tmp:
        Path(tmp).write_text(roofline_svg(rep.perf, list(rep.verdicts)), encoding="utf-8")
