"""How many events an Nsight Systems export holds, and what reading it whole is estimated to
peak at, from the standard library alone.

Nothing here imports polars: the CLI sizes polars' allocator setting from the estimate before
polars starts (``proflab.cli``), and the reader and the memory budget (``readers.budget``)
use the same counts. The counts are rowid bounds, two B-tree seeks a table: nothing is read.
"""

from __future__ import annotations

import sqlite3
import urllib.parse
from pathlib import Path

__all__ = ["SQLITE_MAGIC", "EVENT_TABLES", "GPU_TABLES", "COST_FIXED", "COST_GPU", "COST_HOST", "PART_MARGIN", "ALL_PARTS_MARGIN", "sniff", "table_rows",
           "event_table_rows", "rowid_bounds", "read_only_uri", "estimate", "whole_bytes"]  # fmt: skip

SQLITE_MAGIC = b"SQLite format 3\x00"

# the tables of events, read in this order (what read progress counts)
EVENT_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
                "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER", "NVTX_EVENTS", "OSRT_API")  # fmt: skip
GPU_TABLES = EVENT_TABLES[:3]

# Peak RSS of a whole read and analysis (proflab analyze, 2 cores), as measured on the scaled
# exports of bench_nsys_large.py: a fixed part (interpreter, polars, the name dictionary), a
# cost per GPU activity (its row, the device sets, gaps, launch links) and one per host event.
# The peak of one export differs from run to run (the allocators' arenas): by up to 6.7 %
# (the 1.47 GB T4 export: 4.00-4.27 GB in four runs; the 1,048 MB H100 one 1.45 GB in most
# runs, 1.52 GB in one of four), so the costs stand for the highest peak: re-measured on six
# exports (H100 emit_nvtx ones of 0.52, 1.05 and 2.1 GB, T4 mixes of runtime calls and short
# kernels of 0.36, 0.73 and 1.47 GB; four runs each, twelve of the 1.05 GB one), the estimate
# is 1.3-6.7 % above the highest of each (a fit to the lowest put the 1.47 GB one's highest
# 3.7 % above it, and a 1.5 GB budget let the 1,048 MB export be read whole and peak past
# it). (A part costs more per event than a whole read, up to 126 bytes an event against 99
# on the H100 export: hence the margins.) Measured with polars' allocator returning freed
# pages at once, as the CLI starts it where the estimate comes near the budget.
COST_FIXED = 160_000_000
COST_GPU = 454
COST_HOST = 33
# Of the budget (less the fixed part), what a part read for the budget is planned to fill:
# small parts cost more an event (``readers.budget``), and more with the oldest polars the
# project supports (1.37) than with 2.x. The 126 MB export of tests/test_nsys_scale.py under
# 250 MB, three runs each: one part planned at 0.8 peaked at 214-218 MB with polars 2.1 and
# 233-241 MB with 1.37 (planned 232); at 0.7, 203-213 and 223-226 (planned 223).
PART_MARGIN = 0.7
# An analysis of every event in parts (``--all-parts``) holds more than one part does: the
# process's resting memory grows part by part (the allocators' arenas: 184 -> 197 MB over three
# parts with polars 1.37), and a later part's read peaks higher than the first's. The same
# export in parts planned at 0.8 peaked at 218-220 MB with polars 2.1 and 238-243 MB with 1.37
# (252 MB once on a loaded 2-core machine), past its plan of 232; at 0.6 (four parts, not
# three; 4.5 -> 5.7 s), 191-193 and 208-211 (plan 214).
ALL_PARTS_MARGIN = 0.6


def sniff(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(16) == SQLITE_MAGIC
    except OSError:
        return False


def read_only_uri(path: Path) -> str:
    """A read-only SQLite URI for ``path``; '?', '#' and '%' in a name are escaped."""
    return f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"


def table_rows(path: str | Path) -> dict[str, int] | None:
    """How many rows each event table of the export holds, from their rowid bounds (two B-tree
    seeks a table, nothing read): what a whole read will hold in memory scales with them
    (``estimate``). None for a file that is not an export that opens; the read itself says
    what is wrong with it."""
    path = Path(path)
    if not sniff(path):
        return None
    try:
        con = sqlite3.connect(read_only_uri(path), uri=True)
    except sqlite3.Error:
        return None
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        return event_table_rows(con, tables)
    except (sqlite3.Error, UnicodeDecodeError):
        return None
    finally:
        con.close()


def event_table_rows(con: sqlite3.Connection, tables: set[str]) -> dict[str, int]:
    """The rowids each event table present spans, from its bounds (two B-tree seeks a table;
    a table without rowids is not counted), but no more rows than the file can hold (a row
    takes more than 8 bytes; a damaged rowid may span 2**64)."""
    most = _file_bytes(con) // 8
    out = {}
    for t in EVENT_TABLES:
        if t in tables:
            try:
                low, top = con.execute(rowid_bounds(t)).fetchone()
            except sqlite3.OperationalError:
                continue
            if top is not None:
                out[t] = min(top - low + 1, most)
    return out


def _file_bytes(con: sqlite3.Connection) -> int:
    return con.execute("PRAGMA page_count").fetchone()[0] * con.execute("PRAGMA page_size").fetchone()[0]


def rowid_bounds(table: str) -> str:
    """The query for a table's lowest and highest rowid: one subquery each, which SQLite
    answers by a seek of the rowid B-tree; both in one select scan the whole table (0.51 s of
    the 1048 MB export's 8.6 M NVTX rows)."""
    return f'SELECT (SELECT min(rowid) FROM "{table}"), (SELECT max(rowid) FROM "{table}")'


def estimate(rows: dict[str, int]) -> int:
    """Bytes a whole read and analysis of an export with these event-table rows is measured
    to peak at."""
    return COST_FIXED + sum(n * (COST_GPU if t in GPU_TABLES else COST_HOST) for t, n in rows.items())


def whole_bytes(path) -> tuple[int, int] | None:
    """(event rows, estimated peak bytes) of reading ``path`` whole; None when it is no
    export that opens (the read says what is wrong)."""
    rows = table_rows(path)
    return None if rows is None else (sum(rows.values()), estimate(rows))
