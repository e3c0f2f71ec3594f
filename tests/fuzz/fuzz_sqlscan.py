"""Coverage-guided fuzzer of the SQLite column reader (``_sqlscan.c``), built with ASan, UBSan
and libFuzzer's counters (``native.py``). An input is either a whole SQLite file (the seeds
are real exports, so mutants are damaged exports, as nsys or a disk leaves them) read with
the queries the Nsight Systems reader makes, or, not starting with SQLite's header, a table
the input describes (values of every storage class, text of any bytes) read as integers,
text, coded text and cut text. Either way the reader returns its columns (which polars then
takes) or a reason, never more. ``python tests/fuzz/run.py sqlscan --seconds 60``."""

from __future__ import annotations

import os
import sqlite3
import sys
import tempfile
from pathlib import Path

import atheris

from native import load

sqlscan = load("sqlscan", sys.argv[1])
import polars as pl  # noqa: E402

from proflab.readers import _sqlite_native as sn  # noqa: E402  (takes the instrumented module)
from proflab.readers.nsys_sqlite import read_only_uri  # noqa: E402

assert sn.available(), "the instrumented reader did not bind SQLite"
I, T = pl.Int64, pl.String
CUT = (b", seq = ", b", op_id = ")
# (query, schema, cut markers, coded columns): what the Nsight Systems reader asks
QUERIES = [
    ("SELECT k.demangledName, k.deviceId, k.streamId, k.start, k.end - k.start, k.correlationId, k.globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL k",
     {"name": I, "device": I, "stream": I, "start_ns": I, "dur_ns": I, "correlation": I, "pid": I}, (), ()),
    ("SELECT id, value FROM StringIds", {"id": I, "value": T}, (), ()),
    ("SELECT coalesce(n.text, ''), n.textId, n.globalTid, n.start, n.end - n.start FROM NVTX_EVENTS n WHERE n.end IS NOT NULL",
     {"name": T, "text_id": I, "tid": I, "start_ns": I, "dur_ns": I}, CUT, ("name",)),
    ("SELECT r.nameId, r.globalTid, r.start, r.end - r.start, r.correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME r",
     {"name": I, "tid": I, "start_ns": I, "dur_ns": I, "correlation": I}, (), ()),
]
FOLDER = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
PATH = os.path.join(FOLDER, f"proflab-fuzz-{os.getpid()}.sqlite")
HEADER = b"SQLite format 3\x00"
STORAGE = ("integer", "real", "text", "blob", "null")


def read(queries) -> None:
    cons = sn.Connections(read_only_uri(Path(PATH)))
    try:
        for sql, schema, cut, coded in queries:
            got = cons.frame(sql, schema, cut, 0, coded)
            if got is not None:  # polars takes the columns (the C data interface): they must hold
                frame = got.frame if isinstance(got, sn.Coded) else got
                frame.height  # noqa: B018
    finally:
        cons.close()


def described(data: bytes) -> None:
    """A table of up to 64 rows of three columns from the input, read as the reader reads."""
    fdp = atheris.FuzzedDataProvider(data)
    con = sqlite3.connect(PATH)
    try:
        con.execute("CREATE TABLE t (a, b, c)")
        rows = []
        for _ in range(fdp.ConsumeIntInRange(0, 64)):
            row = []
            for _ in range(3):
                kind = STORAGE[fdp.ConsumeIntInRange(0, 4)]
                row.append({"integer": lambda: fdp.ConsumeInt(8), "real": fdp.ConsumeRegularFloat,
                            "text": lambda: fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 40)),
                            "blob": lambda: fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 40)), "null": lambda: None}[kind]())
                if kind == "text":  # (bytes stored as TEXT, whatever they are)
                    row[-1] = ("text", row[-1])
            rows.append(row)
        for row in rows:
            values = [v[1] if isinstance(v, tuple) else v for v in row]
            marks = ["CAST(? AS TEXT)" if isinstance(v, tuple) else "?" for v in row]
            con.execute(f"INSERT INTO t VALUES ({', '.join(marks)})", values)
        con.commit()
    finally:
        con.close()
    kinds = fdp.ConsumeBytes(3).ljust(3, b"i")
    schema = {c: (T if k % 3 else I) for c, k in zip("abc", kinds)}
    coded = tuple(c for c, k in zip("abc", kinds) if k % 3 == 2)
    cut = (b"\x2c\x20", b"\x2c\x3d") if fdp.ConsumeBool() else ()
    read([("SELECT a, b, c FROM t", schema, cut, coded)])


def one(data: bytes) -> None:
    try:
        os.unlink(PATH)
    except FileNotFoundError:
        pass
    if data.startswith(HEADER):
        with open(PATH, "wb") as f:
            f.write(data)
        read(QUERIES)
    else:
        described(data)


if __name__ == "__main__":
    atheris.Setup([sys.argv[0], *sys.argv[2:]], one)
    atheris.Fuzz()
