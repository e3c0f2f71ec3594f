"""Deterministic bad-input generator for the fuzzing suite (``tests/test_fuzz.py``).

Every case starts from a real recorded input (``tests/data`` and, when present, the shared
fixtures), cut down to a small excerpt so that a case reads in tens of milliseconds, and
breaks it one way: bytes (truncation, bit flips, NUL bytes, invalid UTF-8, a bad gzip CRC),
structure (wrong types for a field, NaN/Infinity/huge integers, negative durations, shuffled
and duplicated events, megabyte names, HTML/ANSI/control characters in names), SQLite (missing
tables, wrong column types, dropped columns) or CSV (missing and shuffled columns, other
locales). A case is a pure function of (family, index): the same number always builds the
same bytes, so a failure is reproduced by its test id alone.
"""

from __future__ import annotations

import copy
import csv
import gzip
import io
import json
import random
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent
DATA = TESTS_DIR / "data"
from shared_fixtures import FIXTURES  # noqa: E402

# Names a trace may carry that must never reach a terminal or a page as markup or escapes.
HOSTILE_NAMES = (
    "\x1b[31mred\x1b[0m kernel",
    "\x1b]0;owned\x07title",
    "\x1b]8;;http://example.invalid\x1b\\link\x1b]8;;\x1b\\",
    "\x9b31mC1 CSI\x9b0m",
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "a\x00b\x01c\x08d\x0be\x0cf\x7fg",
    "line\nbreak\rreturn\ttab",
    "\u202eevil\u202c bidi",
    "[link](javascript:alert(1)) *bold* `code` | pipe",
    "`</code><script>alert(2)</script>`",
    "\ud7ff\ue000\ufffd\U0001f600",
    "",
)
BAD_VALUES = (
    None, True, False, "", "text", "12", "0x1f", "-3", "1e400", "NaN", [], {}, [1, 2, 3], {"a": 1},
    -1, 0, 2**31, 2**53 + 1, 2**63, 2**64 + 7, -(2**63) - 1, 10**30, -(10**30),
    float("nan"), float("inf"), float("-inf"), 1e308, -1e308, -0.0, 1.5e-300,
)
# CSV cells: the text ncu could never have written, and numbers as other locales write them.
BAD_CELLS = ("", "n/a", "NaN", "inf", "-inf", "1e999", "-5", "18446744073709551617", "1,234.5", "1.234,5",
             "1 234,5", "٣٫١٤", "\x1b[2J", "<b>x</b>", "\x00", "(1, 2", "((((", "1e-400", "--", "0x10")


def _bad(rng: random.Random):
    """One of BAD_VALUES, a copy: a mutation that later edits what it was given in place (adds
    events to a list that became ``traceEvents``) must never change the constants, which made a
    case's input depend on the cases built before it in the process (and one list hold itself)."""
    return copy.deepcopy(rng.choice(BAD_VALUES))


@dataclass(frozen=True)
class Case:
    """One input to feed a reader: ``paths`` (first is what the command names) and how."""

    family: str
    index: int
    what: str
    paths: tuple[Path, ...]
    kind: str  # "trace" (load + analyze), "ncu" (ncu.load + deep_dive), "rundir", "runs"


# --- seeds: small excerpts of real inputs -------------------------------------------------------


def _kineto_doc(path: Path) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8") as f:
        return json.load(f)


def _excerpt_events(doc: dict | list, n: int) -> dict:
    """The first ``n`` complete events (by start) and every metadata event of a real trace
    (the Chrome array form becomes the object form; the array cases write it back)."""
    doc = {"traceEvents": doc} if isinstance(doc, list) else doc
    events = doc["traceEvents"]
    meta = [e for e in events if e.get("ph") == "M"]
    timed = sorted((e for e in events if e.get("ph") != "M" and "ts" in e), key=lambda e: float(e["ts"]))[:n]
    return {**doc, "traceEvents": meta + timed}


def kineto_seeds() -> dict[str, dict]:
    """Documents of real Kineto traces (PyTorch 1.8 to 2.13, H100/A100/V100/CPU), small."""
    seeds: dict[str, dict] = {}
    for name, path, n in (
        ("h2d_h100", DATA / "kineto" / "pageable_h2d.pt.trace.json.gz", 400),
        ("gemm_h100", DATA / "kineto" / "healthy_bf16_gemm.pt.trace.json.gz", 400),
        ("sync_h100", DATA / "kineto" / "sync_every_step.pt.trace.json.gz", 500),
        ("train_h100", DATA / "kineto" / "train_loop.pt.trace.json.gz", 500),
        ("v100_torch18", DATA / "compat" / "kineto_tb_plugin_gpu_metrics_input_torch1.8_v100.json.gz", 400),
        ("a100_2022", DATA / "compat" / "hta_call_stack_backward_thread_2022_a100.json.gz", 400),
        ("cpu_torch213", DATA / "compat" / "torch2.13_cpu_mlp.pt.trace.json.gz", 300),
        ("memory_h100", DATA / "memory" / "graph_leak.pt.trace.json.gz", 500),  # [memory] events
    ):
        if path.is_file():
            seeds[name] = _excerpt_events(_kineto_doc(path), n)
    chrome = FIXTURES / "kineto" / "t4_power_iteration_baseline_nsys_chrome.json"
    if chrome.is_file():
        seeds["t4_nsys_chrome"] = _excerpt_events(_kineto_doc(chrome), 400)
    return seeds


def nsys_seed(src: Path, dst: Path, rows: int = 150) -> Path:
    """A real export cut to its first ``rows`` rows of every event table (all lookups kept)."""
    shutil.copyfile(src, dst)
    dst.chmod(0o644)
    con = sqlite3.connect(dst)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for t in tables:
            if t.startswith(("CUPTI_ACTIVITY_KIND_", "NVTX_EVENTS", "OSRT_API", "CUDA_GPU_MEMORY")):
                order = "start" if "start" in _columns(con, t) else "rowid"
                con.execute(f'DELETE FROM "{t}" WHERE rowid NOT IN (SELECT rowid FROM "{t}" ORDER BY {order} LIMIT {rows})')
        con.commit()
        con.execute("VACUUM")
    finally:
        con.close()
    return dst


def nsys_sources() -> list[Path]:
    d = FIXTURES / "nsys"
    return sorted(d.glob("*.sqlite")) if d.is_dir() else []


def ncu_seeds() -> dict[str, tuple[str, str | None]]:
    """Real ncu CSV pages (raw, details), cut to a few kernels: name -> (raw text, details text)."""
    out: dict[str, tuple[str, str | None]] = {}
    for stem in ("train_step", "workloads_targeted", "spill_targeted"):
        raw_p, det_p = DATA / "ncu" / f"{stem}_raw.csv.gz", DATA / "ncu" / f"{stem}_details.csv.gz"
        if not raw_p.is_file():
            continue
        raw = gzip.decompress(raw_p.read_bytes()).decode("utf-8").splitlines(keepends=True)
        details = gzip.decompress(det_p.read_bytes()).decode("utf-8").splitlines(keepends=True) if det_p.is_file() else None
        # raw: header, units, one row per launch; details: one row per metric
        out[stem] = ("".join(raw[:6]), "".join(details[:240]) if details else None)
    fixture = FIXTURES / "ncu" / "copy_blocked_details.csv"
    if fixture.is_file():
        out["copy_blocked"] = ("", fixture.read_text(encoding="utf-8"))
    return out


def run_dirs() -> list[Path]:
    d = DATA / "runs"
    return sorted(p for p in d.iterdir() if (p / "meta.json").is_file()) if d.is_dir() else []


# --- byte-level mutations -----------------------------------------------------------------------


def truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(0, max(1, len(data)))]


def bit_flips(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.choice((1, 2, 8, 64))):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


def insert_bytes(data: bytes, rng: random.Random) -> bytes:
    junk = rng.choice((b"\x00", b"\x00" * 64, b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80",
                       b"\xef\xbb\xbf", b"\x1b[2J"))
    i = rng.randrange(len(data) + 1)
    return data[:i] + junk + data[i:]


def zero_block(data: bytes, rng: random.Random) -> bytes:
    i = rng.randrange(len(data))
    n = rng.choice((16, 512, 4096))
    return data[:i] + b"\x00" * min(n, len(data) - i) + data[i + n :]


BYTE_MUTATIONS: dict[str, Callable[[bytes, random.Random], bytes]] = {
    "truncate": truncate, "bit_flips": bit_flips, "insert_bytes": insert_bytes, "zero_block": zero_block,
}  # fmt: skip


def gzip_bytes(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=1, mtime=0)


def bad_crc(gz: bytes, rng: random.Random) -> bytes:
    """A gzip member whose CRC32 (or length) trailer does not match its data."""
    b = bytearray(gz)
    b[-1 - rng.randrange(8)] ^= 0xFF
    return bytes(b)


def gzip_mutation(raw: bytes, rng: random.Random) -> tuple[str, bytes]:
    gz = gzip_bytes(raw)
    choice = rng.randrange(6)
    if choice == 0:
        return "gzip_bad_crc", bad_crc(gz, rng)
    if choice == 1:
        return "gzip_truncated", gz[: rng.randrange(1, len(gz))]
    if choice == 2:
        return "gzip_bit_flips", bit_flips(gz, rng)
    if choice == 3:
        return "gzip_trailing_garbage", gz + bytes(rng.randrange(256) for _ in range(rng.choice((1, 7, 100))))
    if choice == 4:
        return "gzip_of_truncated_json", gzip_bytes(truncate(raw, rng))
    return "gzip_header_only", gz[:10]


# --- structural mutations of a Kineto document --------------------------------------------------

_EVENT_FIELDS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "id", "bp", "s")
_ARG_FIELDS = ("device", "stream", "correlation", "External id", "grid", "block", "registers per thread",
               "shared memory", "bytes", "memory bandwidth (GB/s)", "context", "Python id", "Sequence number",
               "Fwd thread id", "cbid", "Input Dims", "warps per SM", "est. achieved occupancy %", "queued")
_TOP_FIELDS = ("traceEvents", "deviceProperties", "displayTimeUnit", "baseTimeNanoseconds", "schemaVersion",
               "distributedInfo", "traceName")


def _events(doc):
    ev = doc.get("traceEvents") if isinstance(doc, dict) else doc
    return ev if isinstance(ev, list) else []


def _pick(events: list, rng: random.Random, k: int) -> list[dict]:
    timed = [e for e in events if isinstance(e, dict)]
    return [rng.choice(timed) for _ in range(k)] if timed else []


def m_wrong_type(doc, rng):
    field = rng.choice(_EVENT_FIELDS)
    value = _bad(rng)
    for e in _pick(_events(doc), rng, rng.choice((1, 5, 50))):
        e[field] = value
    return f"event.{field}={value!r}"[:60]


def m_wrong_arg_type(doc, rng):
    field = rng.choice(_ARG_FIELDS)
    value = _bad(rng)
    for e in _pick(_events(doc), rng, rng.choice((1, 5, 50))):
        if not isinstance(e.get("args"), dict):
            e["args"] = {}
        e["args"][field] = value
    return f"args.{field}={value!r}"[:60]


def m_wrong_top(doc, rng):
    if not isinstance(doc, dict):
        return "array form: top unchanged"
    field = rng.choice(_TOP_FIELDS)
    doc[field] = copy.deepcopy(rng.choice(BAD_VALUES + ([{"0": "x"}], [[1]], "ns", "us", "ms")))
    return f"top.{field}"


def m_device_properties(doc, rng):
    if not isinstance(doc, dict):
        return "array form"
    props = doc.get("deviceProperties")
    if isinstance(props, list) and props and isinstance(props[0], dict):
        props[0][rng.choice(list(props[0]) or ["id"])] = _bad(rng)
    else:
        doc["deviceProperties"] = [{"id": _bad(rng), "name": rng.choice(HOSTILE_NAMES),
                                    "numSms": _bad(rng), "totalGlobalMem": _bad(rng)}]
    return "deviceProperties"


def m_extreme_numbers(doc, rng):
    value = rng.choice((float("nan"), float("inf"), float("-inf"), 2**64 + 1, -(2**63), 1e300, -1e300, 10**25))
    field = rng.choice(("ts", "dur"))
    for e in _pick(_events(doc), rng, rng.choice((1, 20))):
        e[field] = value
    return f"{field}={value!r}"


def m_negative_dur(doc, rng):
    for e in _pick(_events(doc), rng, rng.choice((1, 10, 1000))):
        if isinstance(e.get("dur"), (int, float)):
            e["dur"] = -abs(e["dur"]) - rng.choice((0.001, 1, 1e6))
    return "negative dur"


def m_shuffle(doc, rng):
    ev = _events(doc)
    rng.shuffle(ev)
    return "shuffled events"


def m_reverse_time(doc, rng):
    for e in _events(doc):
        if isinstance(e, dict) and isinstance(e.get("ts"), (int, float)):
            e["ts"] = -e["ts"]
    return "negated ts"


def m_duplicate(doc, rng):
    ev = _events(doc)
    if rng.random() < 0.5:
        ev.extend(json.loads(json.dumps(ev)))
        return "every event twice"
    for e in _pick(ev, rng, 30):
        ev.insert(rng.randrange(len(ev) + 1), dict(e))
    return "30 events duplicated"


def m_hostile_names(doc, rng):
    names = list(HOSTILE_NAMES)
    for e in _pick(_events(doc), rng, rng.choice((5, 100))):
        e["name"] = rng.choice(names) + str(e.get("name", ""))[:40]
    return "hostile names"


def m_huge_name(doc, rng):
    big = rng.choice(("K", "\x1b[31m", "<", "é")) * rng.choice((1 << 20, 1 << 18))
    for e in _pick(_events(doc), rng, rng.choice((1, 3))):
        e["name"] = big
    return "megabyte name"


def m_drop_fields(doc, rng):
    field = rng.choice(_EVENT_FIELDS)
    for e in _pick(_events(doc), rng, rng.choice((1, 10, 1000))):
        e.pop(field, None)
    return f"no {field}"


def m_unknown_events(doc, rng):
    ev = _events(doc)
    for _ in range(20):
        ev.insert(rng.randrange(len(ev) + 1), {"ph": rng.choice(("X", "B", "E", "i", "s", "f", "C", "Z", 7, None)),
                                              "cat": rng.choice(("kernel", "gpu_memcpy", "cuda_runtime", "ac2g", "cpu_op",
                                                                 "???", "", None, 3)),
                                              "name": rng.choice(HOSTILE_NAMES), "ts": _bad(rng),
                                              "dur": _bad(rng), "pid": _bad(rng),
                                              "tid": _bad(rng), "id": _bad(rng),
                                              "args": _bad(rng)})
    return "random events"


def m_only_one_kind(doc, rng):
    cat = rng.choice(("kernel", "cpu_op", "cuda_runtime", "gpu_memcpy", "user_annotation", "ac2g", "python_function"))
    ev = _events(doc)
    ev[:] = [e for e in ev if isinstance(e, dict) and e.get("cat") == cat]
    return f"only {cat}"


def m_empty(doc, rng):
    _events(doc).clear()
    return "no events"


STRUCT_MUTATIONS: dict[str, Callable] = {
    "wrong_type": m_wrong_type, "wrong_arg_type": m_wrong_arg_type, "wrong_top": m_wrong_top,
    "device_properties": m_device_properties, "extreme_numbers": m_extreme_numbers,
    "negative_dur": m_negative_dur, "shuffle": m_shuffle, "reverse_time": m_reverse_time,
    "duplicate": m_duplicate, "hostile_names": m_hostile_names, "huge_name": m_huge_name,
    "drop_fields": m_drop_fields, "unknown_events": m_unknown_events, "only_one_kind": m_only_one_kind,
    "empty": m_empty,
}  # fmt: skip


def dump_json(doc) -> bytes:
    # allow_nan: NaN and Infinity as bare words, which Python's json and some tools write
    return json.dumps(doc, allow_nan=True, ensure_ascii=False).encode("utf-8", "surrogatepass")


# --- SQLite mutations ---------------------------------------------------------------------------


def _tables(con) -> list[str]:
    return [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]


def _columns(con, t: str) -> list[str]:
    return [r[1] for r in con.execute(f'PRAGMA table_info("{t}")')]


_NSYS_KEY_TABLES = ("StringIds", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY",
                    "CUPTI_ACTIVITY_KIND_MEMSET", "NVTX_EVENTS", "TARGET_INFO_GPU", "TARGET_INFO_CUDA_DEVICE",
                    "ThreadNames", "PROCESSES", "ENUM_CUDA_MEMCPY_OPER", "ENUM_CUDA_MEM_KIND", "META_DATA_EXPORT")
_SQL_VALUES = ("NULL", "'text'", "'12'", "X'00FF10'", "-1", "0", "9223372036854775807", "-9223372036854775808",
               "1e300", "-1e300", "0.5", "'\x1b[31m'", "'<script>'")


def sqlite_mutation(db: Path, rng: random.Random) -> str:
    """One change to the export; a change its own constraints refuse gives way to another."""
    for _ in range(20):
        try:
            return _sqlite_mutation(db, rng)
        except sqlite3.DatabaseError:
            continue
    return "unchanged"


def _sqlite_mutation(db: Path, rng: random.Random) -> str:
    con = sqlite3.connect(db)
    try:
        tables = _tables(con)
        key = [t for t in _NSYS_KEY_TABLES if t in tables] or tables
        t = rng.choice(key)
        cols = _columns(con, t)
        choice = rng.randrange(10)
        if choice == 0:
            con.execute(f'DROP TABLE "{t}"')
            what = f"no {t}"
        elif choice == 1:
            c = rng.choice(cols)
            v = rng.choice(_SQL_VALUES)
            where = rng.choice(("", " WHERE rowid % 7 = 0", " WHERE rowid = (SELECT min(rowid) FROM \"%s\")" % t))
            con.execute(f'UPDATE "{t}" SET "{c}" = {v}{where}')
            what = f"{t}.{c}={v}"
        elif choice == 2 and "end" in cols and "start" in cols:
            con.execute(f'UPDATE "{t}" SET "end" = "start" - {rng.choice((1, 1000, 10**12))}')
            what = f"{t}: end before start"
        elif choice == 3 and len(cols) > 1:
            c = rng.choice(cols)
            # rebuild without the column (works on every SQLite, unlike DROP COLUMN on a key)
            keep = ", ".join(f'"{x}"' for x in cols if x != c)
            con.execute(f'CREATE TABLE "_tmp" AS SELECT {keep} FROM "{t}"')
            con.execute(f'DROP TABLE "{t}"')
            con.execute(f'ALTER TABLE "_tmp" RENAME TO "{t}"')
            what = f"{t} without {c}"
        elif choice == 4:
            con.execute(f'INSERT INTO "{t}" SELECT * FROM "{t}"')
            what = f"{t} rows twice"
        elif choice == 5 and "StringIds" in tables:
            con.execute("UPDATE StringIds SET value = ? || value WHERE id % 3 = 0", (rng.choice(HOSTILE_NAMES),))
            if rng.random() < 0.3:
                con.execute("UPDATE StringIds SET value = ? WHERE id = (SELECT min(id) FROM StringIds)", ("N" * (1 << 20),))
            what = "hostile strings"
        elif choice == 6:
            con.execute(f'DELETE FROM "{t}"')
            what = f"{t} empty"
        elif choice == 7 and "start" in cols:
            con.execute(f'UPDATE "{t}" SET "start" = {rng.choice(("9223372036854775807", "-9223372036854775807", "NULL", "0"))}'
                        f' WHERE rowid % 5 = 0')
            what = f"{t}: extreme start"
        elif choice == 8:
            # same name, every column text
            decl = ", ".join(f'"{c}" TEXT' for c in cols)
            con.execute(f'CREATE TABLE "_tmp" ({decl})')
            con.execute(f'INSERT INTO "_tmp" SELECT {", ".join(repr(c).replace(chr(39), chr(34)) for c in cols)} FROM "{t}"')
            con.execute(f'UPDATE "_tmp" SET "{rng.choice(cols)}" = \'x\' || rowid')
            con.execute(f'DROP TABLE "{t}"')
            con.execute(f'ALTER TABLE "_tmp" RENAME TO "{t}"')
            what = f"{t}: text columns"
        else:
            for x in tables:
                if x != "StringIds":
                    con.execute(f'DROP TABLE "{x}"')
            what = "only StringIds"
        con.commit()
    finally:
        con.close()
    return what


# --- CSV mutations ------------------------------------------------------------------------------


def csv_mutation(text: str, rng: random.Random) -> tuple[str, str]:
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        return "empty", ""
    width = len(rows[0])
    choice = rng.randrange(11)
    if choice == 0:
        i = rng.randrange(width)
        rows = [r[:i] + r[i + 1 :] for r in rows]
        what = f"no column {i}"
    elif choice == 1:
        order = list(range(width))
        rng.shuffle(order)
        rows = [[r[j] for j in order if j < len(r)] for r in rows]
        what = "shuffled columns"
    elif choice == 2:
        # a German/French locale: decimal comma, period or space thousands, semicolons
        rows = [[c.replace(",", " ").replace(".", ",") for c in r] for r in rows]
        out = io.StringIO()
        csv.writer(out, delimiter=";", quoting=csv.QUOTE_ALL).writerows(rows)
        return "decimal comma; semicolons", out.getvalue()
    elif choice == 3:
        for r in rows[1:]:
            if r:
                r[rng.randrange(len(r))] = rng.choice(BAD_CELLS)
        what = "bad cells"
    elif choice == 4:
        for r in rows[1:]:
            if r:
                r[rng.randrange(len(r))] = rng.choice(HOSTILE_NAMES) * rng.choice((1, 1000))
        what = "hostile cells"
    elif choice == 5:
        rows = rows[:1]
        what = "header only"
    elif choice == 6:
        rows = rows + rows[1:]
        what = "rows twice"
    elif choice == 7:
        rows = [r[: rng.randrange(1, max(2, len(r)))] if k and rng.random() < 0.3 else r for k, r in enumerate(rows)]
        what = "ragged rows"
    elif choice == 8:
        rows[0] = [h.upper() if rng.random() < 0.3 else h + " " for h in rows[0]]
        what = "renamed header"
    elif choice == 9:
        out = io.StringIO()
        csv.writer(out, quoting=csv.QUOTE_ALL).writerows(rows)
        return "BOM and CRLF", "\ufeff" + out.getvalue().replace("\n", "\r\n")
    else:
        for r in rows[1:]:
            for k, c in enumerate(r):
                if c.replace(".", "", 1).isdigit():
                    r[k] = rng.choice(("nan", "inf", "-" + c, c + "e300", "1" * 400))
        what = "numbers out of range"
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL).writerows(rows)
    return what, out.getvalue()


# --- the cases ----------------------------------------------------------------------------------

FAMILIES = ("kineto_json", "kineto_gz", "chrome_array", "kineto_bytes", "nsys", "ncu", "rundir")
# share of the cases each family gets (they differ in cost: an nsys case reads SQLite)
WEIGHTS = {"kineto_json": 6, "kineto_gz": 3, "chrome_array": 2, "kineto_bytes": 3, "nsys": 3, "ncu": 3, "rundir": 1}


def plan(total: int) -> list[tuple[str, int]]:
    """(family, index) for ``total`` cases, split by WEIGHTS."""
    w = sum(WEIGHTS.values())
    out = []
    for fam in FAMILIES:
        out += [(fam, i) for i in range(max(1, total * WEIGHTS[fam] // w))]
    return out


class Builder:
    """Writes cases under ``root``; seeds are read once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._kineto = kineto_seeds()
        self._ncu = ncu_seeds()
        self._nsys: list[Path] = []
        seeds = root / "_seeds"
        seeds.mkdir(parents=True, exist_ok=True)
        for src in nsys_sources():
            self._nsys.append(nsys_seed(src, seeds / src.name))
        self._runs = run_dirs()

    def available(self, family: str) -> str | None:
        """None, or why the family has no seed here."""
        if family.startswith(("kineto", "chrome")) and not self._kineto:
            return "no recorded Kineto trace in tests/data"
        if family == "nsys" and not self._nsys:
            return f"no Nsight Systems export in {FIXTURES / 'nsys'} (shared fixtures absent)"
        if family == "ncu" and not self._ncu:
            return "no ncu CSV in tests/data/ncu"
        if family == "rundir" and not self._runs:
            return "no run directory in tests/data/runs"
        return None

    def build(self, family: str, index: int) -> Case:
        rng = random.Random(f"{family}:{index}")
        d = self.root / f"{family}-{index}"
        if d.exists():  # built before (in-process, then through the CLI): the same case afresh
            shutil.rmtree(d)
        d.mkdir(parents=True)
        return getattr(self, f"_case_{family}")(rng, d, index)

    def _doc(self, rng) -> tuple[str, dict]:
        name = rng.choice(sorted(self._kineto))
        return name, json.loads(json.dumps(self._kineto[name]))

    def _mutate_doc(self, rng, doc) -> str:
        steps = [rng.choice(sorted(STRUCT_MUTATIONS)) for _ in range(rng.choice((1, 1, 2, 3)))]
        return "+".join(STRUCT_MUTATIONS[s](doc, rng) for s in steps)

    def _case_kineto_json(self, rng, d, index) -> Case:
        name, doc = self._doc(rng)
        what = self._mutate_doc(rng, doc)
        p = d / f"{name}.pt.trace.json"
        p.write_bytes(dump_json(doc))
        return Case("kineto_json", index, f"{name}: {what}", (p,), "trace")

    def _case_kineto_gz(self, rng, d, index) -> Case:
        name, doc = self._doc(rng)
        what = self._mutate_doc(rng, doc) if rng.random() < 0.5 else "unchanged"
        how, data = gzip_mutation(dump_json(doc), rng)
        p = d / f"{name}.pt.trace.json.gz"
        p.write_bytes(data)
        return Case("kineto_gz", index, f"{name}: {what}; {how}", (p,), "trace")

    def _case_chrome_array(self, rng, d, index) -> Case:
        name, doc = self._doc(rng)
        what = self._mutate_doc(rng, doc) if rng.random() < 0.8 else "unchanged"
        events = doc.get("traceEvents") if isinstance(doc, dict) else doc
        data = dump_json(events)
        if rng.random() < 0.3:
            data = truncate(data, rng)  # the Chrome format allows a missing closing bracket
            what += "; truncated"
        p = d / f"{name}.json"
        p.write_bytes(data)
        return Case("chrome_array", index, f"{name} as an array: {what}", (p,), "trace")

    def _case_kineto_bytes(self, rng, d, index) -> Case:
        name, doc = self._doc(rng)
        how = rng.choice(sorted(BYTE_MUTATIONS))
        data = BYTE_MUTATIONS[how](dump_json(doc), rng)
        gz = rng.random() < 0.3
        p = d / (f"{name}.pt.trace.json" + (".gz" if gz else ""))
        p.write_bytes(gzip_bytes(data) if gz else data)
        return Case("kineto_bytes", index, f"{name}: {how}{' (gzip)' if gz else ''}", (p,), "trace")

    def _case_nsys(self, rng, d, index) -> Case:
        src = rng.choice(self._nsys)
        p = d / "report.sqlite"
        shutil.copyfile(src, p)
        if rng.random() < 0.2:
            how = rng.choice(sorted(BYTE_MUTATIONS))
            p.write_bytes(BYTE_MUTATIONS[how](p.read_bytes(), rng))
            what = how
        else:
            what = "; ".join(sqlite_mutation(p, rng) for _ in range(rng.choice((1, 1, 2))))
        return Case("nsys", index, f"{src.stem}: {what}", (p,), "trace")

    def _case_ncu(self, rng, d, index) -> Case:
        name = rng.choice(sorted(self._ncu))
        raw, details = self._ncu[name]
        texts = {"raw.csv": raw, "details.csv": details}
        texts = {k: v for k, v in texts.items() if v}
        which = rng.choice(sorted(texts))
        if rng.random() < 0.15:
            how = rng.choice(sorted(BYTE_MUTATIONS))
            data = {k: v.encode("utf-8") for k, v in texts.items()}
            data[which] = BYTE_MUTATIONS[how](data[which], rng)
        else:
            how, texts[which] = csv_mutation(texts[which], rng)
            data = {k: v.encode("utf-8") for k, v in texts.items()}
        paths = []
        for k, v in sorted(data.items(), key=lambda kv: kv[0] != "raw.csv"):
            (d / k).write_bytes(v)
            paths.append(d / k)
        return Case("ncu", index, f"{name} {which}: {how}", tuple(paths), "ncu")

    def _case_rundir(self, rng, d, index) -> Case:
        src = rng.choice(self._runs)
        run = d / "runs" / src.name
        shutil.copytree(src, run)
        target = rng.choice(["meta.json", "analysis.json", "processes", "traces", "monitor.parquet", "trace"])
        if target == "trace":
            trace = sorted((run / "traces").iterdir())[0]
            how = rng.choice(sorted(BYTE_MUTATIONS))
            trace.write_bytes(BYTE_MUTATIONS[how](trace.read_bytes(), rng))
            what = f"trace {how}"
        elif target in ("processes", "traces"):
            shutil.rmtree(run / target)
            if rng.random() < 0.5:
                (run / target).mkdir()
            what = f"{target}/ removed or empty"
        else:
            f = run / target
            choice = rng.randrange(4)
            if choice == 0:
                f.unlink()
                what = f"no {target}"
            elif choice == 1 and target.endswith(".json"):
                doc = json.loads(f.read_text(encoding="utf-8"))
                if isinstance(doc, dict) and doc:
                    doc[rng.choice(sorted(doc))] = rng.choice(BAD_VALUES + (HOSTILE_NAMES[0],))
                f.write_text(json.dumps(doc, allow_nan=True), encoding="utf-8")
                what = f"{target}: a wrong field"
            else:
                how = rng.choice(sorted(BYTE_MUTATIONS))
                f.write_bytes(BYTE_MUTATIONS[how](f.read_bytes(), rng))
                what = f"{target} {how}"
        kind = "runs" if rng.random() < 0.3 else "rundir"
        return Case("rundir", index, f"{src.name}: {what}", (run if kind == "rundir" else run.parent,), kind)

