"""A piece of an Nsight Systems export's table read by the compiled column reader
(``_sqlscan``): the same frame the ADBC driver gives (``nsys_sqlite._Ctx._fetch_arrow``),
at about the cost of SQLite stepping through the rows.

The reader steps through the query's rows in C without the GIL and hands each column to
polars as an Arrow array (the C data interface) that owns its memory: no Python object per
value, no type inference, no batches to join, and a column dropped is memory freed. It
takes only integers (or NULL) in integer columns and UTF-8 text (or NULL) in text columns
(``Coded``: text as codes into its distinct texts); anything else, or any SQLite error, returns None and
the caller reads the piece through ADBC, which has handled every odd export all along (and
raises the precise error). ``PROFLAB_PURE_PYTHON=1`` turns this path off.

SQLite is the library Python's own ``sqlite3`` module is linked to, found among the
process's mapped files (or by name), so the reader needs no SQLite headers to build and
opens exports with the same SQLite as the rest of the reader.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import threading

import polars as pl

# Imported by name: a compiled module has no Python source, and the import graph the layer
# contract reads (.py files only) would take ``from proflab.readers import _sqlscan`` for an
# import of the package ``proflab.readers`` itself, a cycle that is not there.
try:
    _sqlscan = importlib.import_module("proflab.readers._sqlscan")
except ImportError:  # built without a C compiler: the ADBC driver reads it all
    _sqlscan = None

__all__ = ["available", "Coded", "Connections"]

_VERSION = 1  # SQLSCAN_VERSION of the C source this module reads
_bound: bool | None = None  # SQLite found and bound (None: not tried yet)
sqlite_version: str | None = None  # the bound SQLite library's
_lock = threading.Lock()


def available() -> bool:
    """Whether the compiled reader is built (from this version of its source), has found
    SQLite, and is not turned off."""
    global _bound
    if _sqlscan is None or os.environ.get("PROFLAB_PURE_PYTHON", "") not in ("", "0"):
        return False
    if _bound is None:
        with _lock:
            if _bound is None:
                _bound = _bind()
    return _bound


def _bind() -> bool:
    global sqlite_version
    if _sqlscan.version() != _VERSION:  # a build of another version of the source (an install not rebuilt)
        return False
    for path in _library_paths():
        try:
            sqlite_version = _sqlscan.bind(path)
            return True
        except OSError:
            continue
    return False


def _library_paths() -> list[str]:
    """Where the SQLite library is: the one Python's sqlite3 module mapped into this
    process, else the system's by name."""
    import sqlite3  # noqa: F401  (maps its SQLite library)

    paths = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip("\n").split(None, 5)[-1]
                if "/libsqlite3" in path and path not in paths and os.path.isfile(path):
                    paths.append(path)
    except OSError:  # no /proc (not Linux)
        pass
    if not paths:
        import ctypes.util

        name = ctypes.util.find_library("sqlite3")
        if name:
            paths.append(name)
        elif sys.platform == "darwin":
            paths.append("libsqlite3.dylib")
    return paths


@dataclasses.dataclass(frozen=True)
class Coded:
    """A piece whose text columns named in ``texts`` came as UInt32 codes (null where the text
    is NULL) into their distinct texts, in the order first met: the text of row i is
    ``texts[column][frame[column][i]]``."""

    frame: pl.DataFrame
    texts: dict[str, pl.Series]


class _Array:
    """One column the reader made, as polars takes one (the Arrow PyCapsule interface): each
    column owns its memory, freed when polars drops that column."""

    def __init__(self, schema, array) -> None:
        self._capsules = (schema, array)

    def __arrow_c_array__(self, requested_schema=None):
        return self._capsules


class Connections:
    """One read-only connection per thread that reads (a SQLite connection is used by one
    thread at a time), closed together."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._local = threading.local()
        self._all: list = []
        self._guard = threading.Lock()
        self.failed = False  # SQLite would not open the export: read through ADBC

    def _mine(self):
        con = getattr(self._local, "con", None)
        if con is None:
            got = _sqlscan.open(self.uri)
            if isinstance(got, str):
                self.failed = True
                return None
            con = self._local.con = got
            with self._guard:
                self._all.append(con)
        return con

    def frame(self, sql: str, schema: dict[str, pl.DataType], cut: tuple[bytes, ...] = (), rows: int = 0,
              coded: tuple[str, ...] = ()) -> pl.DataFrame | Coded | None:
        """The rows of ``sql`` as a frame with ``schema``'s names (integers as Int64, text as
        String, not yet cast), or None where the reader gives up. ``cut``: each text is kept
        up to the first of these markers in it (all starting with one ASCII byte). ``rows``:
        how many rows to make room for at first (0: a guess; grown as needed). ``coded``:
        text columns that come as codes into their distinct texts (``Coded``), where any row
        was read: each distinct text is made once, not once a row."""
        if self.failed:
            return None
        con = self._mine()
        if con is None:
            return None
        kinds = b"".join((b"d" if c in coded else b"t") if t == pl.String else b"i" for c, t in schema.items())
        got = _sqlscan.read(con, sql, kinds, tuple(schema), cut, rows)
        if isinstance(got, str):
            return None
        rows, columns, texts = got
        if rows == 0:
            return pl.DataFrame(schema={c: pl.Int64 if k == ord("i") else pl.String for c, k in zip(schema, kinds)})
        frame = pl.DataFrame([pl.Series(_Array(*c)) for c in columns])
        if not texts:
            return frame
        names = [c for c, k in zip(schema, kinds) if k == ord("d")]
        return Coded(frame, {c: pl.Series(_Array(*t)).rename(c) for c, t in zip(names, texts, strict=True)})

    def close(self) -> None:
        with self._guard:
            cons, self._all = self._all, []
        for con in cons:
            _sqlscan.close(con)
