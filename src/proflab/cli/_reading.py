"""The reading options of the commands that read traces (``--steps``/``--window``, ``--no-cache``,
``--memory-budget``), and the loader that reads with them."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path


def reading_args(p: argparse.ArgumentParser):
    """--steps/--window, --no-cache, --memory-budget: the reading group (returned)."""
    g = p.add_argument_group("reading")
    part = g.add_mutually_exclusive_group()
    part.add_argument("--steps", metavar="FIRST:STOP", help="only profiler steps FIRST to STOP-1 (10:20, 10:, :20, or one step N)")
    part.add_argument("--window", metavar="START:END",
                      help="only this time window from the trace's first event, events clipped to it (100ms:250ms; units ns, us, ms, s; ms if none)")
    g.add_argument("--no-cache", dest="cache", action="store_false", default=None,
                   help="neither read nor write the columnar cache of large traces")
    g.add_argument("--memory-budget", type=budget_bytes, default=_DEFAULT_BUDGET, metavar="SIZE",
                   help="analyse a trace that would need more memory than this in a part from its middle that fits, "
                        "and say how far it is like the whole (default 1.5G; 800M, 4GiB; none: read it whole; "
                        "--all-parts: every event, in parts that fit)")
    return g


_DEFAULT_BUDGET = 1_500_000_000  # bytes (readers.budget.DEFAULT_BUDGET, not imported: --help stays instant)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


def budget_bytes(text: str) -> int | None:
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


def reading_options(args: argparse.Namespace) -> dict:
    """The reading options of the command line, as ``proflab.load`` takes them."""
    return {"cache": args.cache, "steps": args.steps, "window": args.window, "memory_budget": args.memory_budget}


def loader(args: argparse.Namespace, *, show_progress: bool = False):
    """``load(path)`` with the reading options of the command line; with ``show_progress``
    and a terminal on stderr, a progress bar while a large trace is read."""
    def read(p):
        from proflab.readers import load_trace as load

        if not (args.steps or args.window):
            warn_if_too_big(Path(p), args.memory_budget)
        if not (show_progress and sys.stderr.isatty()):
            return load(p, **reading_options(args))
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
                return load(p, **reading_options(args))
        finally:
            bar.stop()

    return read


def warn_if_too_big(path: Path, budget: int | None, available: int | None = None) -> None:
    """One line on stderr before an Nsight Systems export is read when what its read and
    analysis are estimated to need (``readers.budget``: the whole export's, or the
    budget's when that is smaller) exceeds the memory available now: the system may stop the
    process partway. The read goes on either way (swap, or a part of the estimate unused)."""
    from proflab.readers import budget as limits

    whole = limits.whole_bytes(path)
    available = available_memory() if available is None else available
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


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (Linux); None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
