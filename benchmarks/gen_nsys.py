"""Scale a real Nsight Systems SQLite export up to a large, realistic one.

The source export is copied, then every event table is doubled in place until the file
reaches the requested size: each doubling appends a copy of all rows shifted in time by the
span of what is already there, with correlation ids offset past the largest one, so that
runtime calls still meet the GPU work they launched and nothing overlaps what it copies.
Strings, devices, enums and metadata are kept as they are, but for the op id in emit_nvtx's
NVTX texts, which each copy renumbers (a real capture's texts are unique). SQLite does the
copying, so the generator needs little memory at any size.

Usage::

    python benchmarks/gen_nsys.py ../shared/fixtures/nsys/h100_2gpu_1s.sqlite big.sqlite --size-mb 1000
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
from pathlib import Path

# event tables: the columns holding times, and whether they carry CUPTI correlation ids
EVENT_TABLES = {
    "CUPTI_ACTIVITY_KIND_KERNEL": True,
    "CUPTI_ACTIVITY_KIND_MEMCPY": True,
    "CUPTI_ACTIVITY_KIND_MEMSET": True,
    "CUPTI_ACTIVITY_KIND_RUNTIME": True,
    "CUPTI_ACTIVITY_KIND_DRIVER": True,
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": True,
    "NVTX_EVENTS": False,
    "OSRT_API": False,
}


def scale(src: Path, out: Path, size_mb: float) -> int:
    """Copy ``src`` to ``out`` and double its events until ``out`` is ``size_mb`` MB;
    returns how many copies of the source's events it holds."""
    shutil.copyfile(src, out)
    con = sqlite3.connect(out)
    con.execute("PRAGMA journal_mode = OFF")
    con.execute("PRAGMA synchronous = OFF")
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")} & EVENT_TABLES.keys()
    tables = {t for t in tables if "start" in {r[1] for r in con.execute(f'PRAGMA table_info("{t}")')}}
    copies = 1
    while out.stat().st_size < size_mb * 1e6:
        t0 = min(con.execute(f"SELECT min(start) FROM {t}").fetchone()[0] or 1 << 62 for t in tables)
        t1 = max(con.execute(f"SELECT max(coalesce(end, start)) FROM {t}").fetchone()[0] or 0 for t in tables)
        corr = 1 + max(
            con.execute(f"SELECT max(correlationId) FROM {t}").fetchone()[0] or 0 for t in tables if EVENT_TABLES[t]
        )
        shift = t1 - t0 + 1000
        for t in sorted(tables):
            cols = [r[1] for r in con.execute(f'PRAGMA table_info("{t}")') if r[1] != "rowid"]
            exprs = []
            for c in cols:
                if c in ("start", "end", "timestamp"):
                    exprs.append(f'"{c}" + {shift}')
                elif c == "correlationId":
                    exprs.append(f'"{c}" + {corr}')
                elif c == "id":  # NVTX/OSRT primary keys, where present
                    exprs.append("NULL")
                elif t == "NVTX_EVENTS" and c == "text":
                    exprs.append(_renumbered_op_id(copies))
                else:
                    exprs.append(f'"{c}"')
            names = ", ".join(f'"{c}"' for c in cols)
            con.execute(f'INSERT INTO "{t}" ({names}) SELECT {", ".join(exprs)} FROM "{t}"')
        con.commit()
        copies *= 2
        print(f"  {copies} copies, {out.stat().st_size / 1e6:.0f} MB", file=sys.stderr)
    con.close()
    return copies


def _renumbered_op_id(copies: int) -> str:
    """NVTX text with emit_nvtx's op id moved past the copies so far ("aten::view, op_id =
    314290" -> "op_id = 10314290"): a real capture's operator ranges have a running op id, so
    nearly every text is unique (99 % in the source exports). Copied verbatim they would
    repeat every few thousand rows, and a reader's cost per distinct text would look small."""
    at = "instr(text, 'op_id = ')"
    rest = f"substr(text, {at} + 8)"
    number = f"CAST({rest} AS INTEGER)"  # SQLite reads the number at the head of the rest
    return (
        f"CASE WHEN {at} > 0 THEN substr(text, 1, {at} + 7) || ({number} + {copies * _OP_IDS}) "
        f"|| substr({rest}, length({number}) + 1) ELSE text END"
    )


# op ids a copy may hold (the source exports' largest is ~1e6)
_OP_IDS = 10_000_000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", type=Path, help="a real Nsight Systems SQLite export")
    p.add_argument("out", type=Path, help="the scaled export to write")
    p.add_argument("--size-mb", type=float, default=1000, help="stop once the file is at least this big (MB)")
    args = p.parse_args(argv)
    scale(args.src, args.out, args.size_mb)
    return 0


if __name__ == "__main__":
    sys.exit(main())
