"""The ``proflab`` command. ``main(argv) -> int`` builds the command line and dispatches; every
ProflabError becomes one line on stderr and exit status 2. ``entry()``: the command itself
(the console script and ``python -m proflab``), which ends the process once ``main`` is done.

Each command has a module here with its parser (``add_parsers(sub)``) and its handler
(``cmd_<name>(args) -> int``); a tight family shares one (``compare`` and ``baseline``,
``report`` and ``demo``). What several commands share is in the private modules: ``_common``
(output options, where the output goes, reports, the Perfetto trace, the HTML page),
``_reading`` (the reading options and the loader), ``_recording`` (what ``run`` records),
``_table`` (plain tables) and ``_process`` (the process around a command). The command modules
import none of each other, and nothing heavy (polars, numpy, duckdb, rich, torch) at the top:
``--help`` builds every parser and imports only these."""

from __future__ import annotations

import argparse
import sys

from proflab._version import __version__
from proflab.cli import analyze, cache, compare, doctor, energy, kernels, memory, report, run, runs, scaling, sql, trial
from proflab.cli._process import allocator_setting, end, map_large_blocks, one_blas_thread, return_freed_memory
from proflab.errors import ProflabError

__all__ = ["main", "entry"]

# in the order ``proflab --help`` lists their commands
_COMMANDS = (analyze, sql, kernels, compare, scaling, energy, memory, run, trial, doctor, report, runs, cache)
# the commands that analyse files (``one_blas_thread``, ``map_large_blocks``)
_ANALYSING = ("analyze", "sql", "compare", "report", "baseline")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="proflab",
        description="GPU performance diagnosis: where the time goes, why, what to change, and how much it saves.",
    )
    p.add_argument("--version", action="version", version=f"proflab {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for command in _COMMANDS:
        command.add_parsers(sub)
    return p


def entry() -> None:
    """The ``proflab`` command: :func:`main` over ``sys.argv``, then the process ends without
    tearing the interpreter down (``_process.end``)."""
    end(main())


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
    return_freed_memory(allocator_setting(args))
    if getattr(args, "command", None) in _ANALYSING:
        one_blas_thread()
        map_large_blocks()
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
