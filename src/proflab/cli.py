"""The ``proflab`` command. ``main(argv) -> int``: one function per subcommand; every
ProflabError becomes one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from proflab import __version__
from proflab.errors import ProflabError, UsageError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="proflab",
        description="GPU performance diagnosis: where the time goes, why, what to change, and how much it saves.",
    )
    p.add_argument("--version", action="version", version=f"proflab {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    a = sub.add_parser(
        "analyze",
        help="diagnose torch.profiler/Kineto traces (.json, .json.gz, or a folder of them)",
        description="Read traces, break GPU time down, find why the GPU idles, rank fixes by estimated gain.",
    )
    a.add_argument("paths", nargs="+", metavar="TRACE", help="trace file(s) or tensorboard_trace_handler folder(s)")
    a.add_argument("-f", "--format", choices=("term", "json", "md"), help="output format (default: term, or from -o suffix)")
    a.add_argument("-o", "--output", metavar="FILE", help="write the report here (atomically) instead of stdout")
    a.add_argument("--top", type=int, default=15, metavar="N", help="hot kernels to list (default 15)")
    a.add_argument("--width", type=int, default=None, metavar="COLS", help="terminal width (default: the terminal's, at most 100)")
    a.add_argument("--color", choices=("auto", "always", "never"), default="auto", help="colour in terminal output")
    a.set_defaults(func=cmd_analyze)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except ProflabError as e:
        print(f"proflab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("proflab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from proflab.api import analyze, load
    from proflab.readers import expand_paths
    from proflab.render import format_for_path, render

    paths = expand_paths(args.paths)
    fmt = args.format or (format_for_path(args.output) if args.output else None) or "term"
    if args.output:
        out = Path(args.output).resolve()
        if any(out == p.resolve() for p in paths):
            raise UsageError(f"{args.output}: refusing to overwrite an input trace")
    if args.top < 0:
        raise UsageError("--top must be >= 0")
    reports = [analyze(load(p), top_kernels=args.top) for p in paths]
    to_tty = not args.output and sys.stdout.isatty()
    color = args.color == "always" or (args.color == "auto" and to_tty and "NO_COLOR" not in os.environ)
    width = args.width or (min(os.get_terminal_size().columns, 100) if to_tty else 80)
    text = render(reports, fmt, width=width, color=color)
    if args.output:
        _write_atomic(Path(args.output), text)
    else:
        sys.stdout.write(text)
    return 0


def _write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a crash never leaves half a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
