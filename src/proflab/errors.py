"""Every error proflab raises on purpose derives from :class:`ProflabError`.

::

    ProflabError                 base; the CLI prints its message on one line and exits 2
    ├── InputError               a file the user handed us cannot be used
    │   ├── InputNotFound        the path does not exist or holds no trace
    │   ├── TruncatedInput       compressed or JSON data ends early
    │   ├── CorruptInput         bytes that do not decode (bad gzip or xz, broken JSON)
    │   ├── UnsupportedFormat    valid data, but not a format proflab reads
    │   ├── SchemaError          a known format with a missing or mistyped field
    │   └── EmptyTrace           a trace with no events to analyse
    ├── UsageError               the command line or API call asks for something impossible
    │   └── QueryError           SQL over a trace that DuckDB refuses (syntax, unknown table or
    │                            column, file or extension access, a failed cast)
    └── CollectError             running or recording a program failed on proflab's side
        ├── BackendUnavailable   a collection backend (NVML, nsys, torch) is missing here; the
        │                        message says why and how to get it
        └── MonitorError         NVML refused a call while sampling (mapped once, from NVMLError)

Messages name the file and say what was expected, so that one line is enough to act on.
"""

from __future__ import annotations

from pathlib import Path

from proflab._controls import escape

__all__ = [
    "ProflabError",
    "InputError",
    "InputNotFound",
    "TruncatedInput",
    "CorruptInput",
    "UnsupportedFormat",
    "SchemaError",
    "EmptyTrace",
    "UsageError",
    "QueryError",
    "CollectError",
    "BackendUnavailable",
    "MonitorError",
]


class ProflabError(Exception):
    """Base of every deliberate proflab error."""


class InputError(ProflabError):
    """A user-supplied file cannot be used; ``path`` names it."""

    def __init__(self, path: str | Path, problem: str) -> None:
        # one line, with the control characters of a file name or of a damaged file's text
        # that another library quotes (SQLite's "unrecognized token") shown as escapes
        self.path = escape(str(path), one_line=True)
        self.problem = escape(problem, one_line=True)
        super().__init__(f"{self.path}: {self.problem}")


class InputNotFound(InputError):
    pass


class TruncatedInput(InputError):
    pass


class CorruptInput(InputError):
    pass


class UnsupportedFormat(InputError):
    pass


class SchemaError(InputError):
    pass


class EmptyTrace(InputError):
    pass


class UsageError(ProflabError):
    pass


class QueryError(UsageError):
    """SQL that cannot run on a trace; the message is DuckDB's, on one line."""


class CollectError(ProflabError):
    """Collection failed on proflab's side (not the profiled program's own failure)."""


class BackendUnavailable(CollectError):
    """A backend cannot run on this machine; the message says why and how to get it."""


class MonitorError(CollectError):
    """NVML refused a call; the message names the call and NVML's reason."""
