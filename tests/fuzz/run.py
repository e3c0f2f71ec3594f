"""Run the C parsers' fuzzers (``fuzz_kscan.py``, ``fuzz_sqlscan.py``) and the what-if replay
walk's (``fuzz_walk.py``) on their sanitizer build, seeded from real inputs (``corpus/``), and replay what once crashed (``crashers/``).

    python tests/fuzz/run.py seed                       # the seed corpus again, from tests/data
    python tests/fuzz/run.py kscan --seconds 60         # a short run (what CI does, per parser)
    python tests/fuzz/run.py sqlscan --seconds 3600 --jobs 2 --keep   # a long one
    python tests/fuzz/run.py walk --seconds 60          # the what-if replay's walk
    python tests/fuzz/run.py replay kscan FILE...       # inputs run once each (a crasher, a corpus)

A run mutates a working copy of the corpus (``build/corpus-NAME``) with the committed one as
its seeds; ``--keep`` writes what crashes into ``crashers/NAME/`` (commit it with the fix) and
merges the inputs that reached new code into ``corpus/NAME/`` (``-merge=1``: the fewest that
keep the coverage). Without ``--keep`` crashes go to ``build/``. Exit status: libFuzzer's
(0: nothing found within the time)."""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
import native  # noqa: E402

MAX_LEN = {"kscan": 65536, "sqlscan": 262144, "walk": 4096}


def fuzz(name: str, seconds: int, jobs: int = 1, keep: bool = False, extra: list[str] = (), runs: int | None = None,
         work: Path | None = None, crashes: Path | None = None) -> int:
    """A run of ``name``'s fuzzer for ``seconds``; ``work``/``crashes``: where it writes (the
    test gives folders of its own)."""
    built = native.build()
    work = work or native.BUILD / f"corpus-{name}"
    work.mkdir(parents=True, exist_ok=True)
    crashes = crashes or ((HERE / "crashers" / name) if keep else (native.BUILD / f"crashes-{name}"))
    crashes.mkdir(parents=True, exist_ok=True)
    extra_seeds = [str(d)] if name == "sqlscan" and (d := shared_seeds()) is not None else []
    args = [sys.executable, str(HERE / f"fuzz_{name}.py"), str(built[name]), str(work), str(HERE / "corpus" / name), *extra_seeds,
            f"-artifact_prefix={crashes}/", f"-max_len={MAX_LEN[name]}", "-timeout=20", "-rss_limit_mb=4096",
            f"-max_total_time={seconds}", "-print_final_stats=1", *extra]
    if runs is not None:
        args.append(f"-runs={runs}")
    if jobs > 1:
        args += [f"-jobs={jobs}", f"-workers={jobs}"]
    rc = subprocess.run(args, env=native.environment(built["runtime"])).returncode
    if keep and rc == 0:  # the inputs that reached new code, minimised into the committed corpus
        subprocess.run([sys.executable, str(HERE / f"fuzz_{name}.py"), str(built[name]), "-merge=1",
                        str(HERE / "corpus" / name), str(work), f"-max_len={MAX_LEN[name]}"],
                       env=native.environment(built["runtime"]), check=False)
    return rc


def replay(name: str, files: list[str]) -> int:
    """Each input once through the instrumented parser (libFuzzer runs the files it is given)."""
    built = native.build()
    if not files:
        return 0
    args = [sys.executable, str(HERE / f"fuzz_{name}.py"), str(built[name]), f"-max_len={MAX_LEN[name]}", "-timeout=20", *files]
    return subprocess.run(args, env=native.environment(built["runtime"])).returncode


def seed() -> None:
    """The committed seed corpus from real inputs: slices of the committed Kineto traces (one
    and four events, in Kineto's layout and compact); an Nsight Systems export built as the
    damaged-export test builds it, and tables described by bytes (the shared fixtures' exports
    join them at run time, ``shared_seeds``)."""
    import gzip

    root = HERE.parents[1]
    out = HERE / "corpus" / "kscan"
    traces = sorted({*sorted((root / "tests" / "data" / "kineto").glob("*.pt.trace.json.gz")), *(root / "tests" / "data" / "compat").glob("*.json.gz")})
    n = 0
    for i, path in enumerate(traces):
        try:
            doc = json.loads(gzip.decompress(path.read_bytes()))
        except (OSError, ValueError):
            continue
        events = doc.get("traceEvents") if isinstance(doc, dict) else doc
        if not isinstance(events, list) or not events:
            continue
        for j, size in enumerate((1, 4)):
            at = (len(events) * (j + 1)) // 4
            part = events[at : at + size]
            kineto = ("[" + ",".join("\n  " + json.dumps(e, indent=2).replace("\n", "\n  ") for e in part) + "\n]").encode()
            compact = json.dumps(part, separators=(",", ":")).encode()
            for data in (kineto, compact):
                if len(data) <= 8192:  # (a seed's events, not its one huge stack or metadata)
                    (out / hashlib.sha1(data).hexdigest()).write_bytes(data)
                    n += 1
    print(f"kscan: {n} seeds from {len(traces)} traces")
    out = HERE / "corpus" / "sqlscan"
    import tempfile

    from test_nsys_damaged import build_export

    with tempfile.TemporaryDirectory() as tmp:
        built = build_export(Path(tmp) / "e.sqlite").read_bytes()
        (out / hashlib.sha1(built).hexdigest()).write_bytes(built)
    for k in range(4):  # tables the input describes (not a SQLite file)
        data = hashlib.sha256(bytes([k])).digest() * (k + 1)
        (out / hashlib.sha1(data).hexdigest()).write_bytes(data)
    print(f"sqlscan: {len(list(out.iterdir()))} seeds")
    seed_walk()


def seed_walk() -> None:
    """Graphs for the replay's walk (``fuzz_walk.graph`` reads the bytes): of a few sizes,
    each whole and with each kind of damage (an index out of range)."""
    out = HERE / "corpus" / "walk"
    out.mkdir(parents=True, exist_ok=True)
    for k, (calls, ops) in enumerate(((1, 0), (3, 2), (12, 20), (40, 63))):
        body = hashlib.sha256(bytes([k])).digest() * (k + 2)
        for damage in (0, 1, 2, 2 | 16, 4, 8):
            data = bytes([calls - 1, ops, damage | 128 if damage else 0]) + body
            (out / hashlib.sha1(data).hexdigest()).write_bytes(data)
    print(f"walk: {len(list(out.iterdir()))} seeds")


def shared_seeds() -> Path | None:
    """Real exports as seeds too, where the shared fixtures are at hand: each cut to its first
    rows and the tables ``fuzz_sqlscan`` queries, in ``build/`` (their bytes are not committed:
    their strings are the recording machine's)."""
    from fuzzing import nsys_seed, nsys_sources

    sources = nsys_sources()
    if not sources:
        return None
    out = native.BUILD / "seeds-sqlscan-shared"
    out.mkdir(parents=True, exist_ok=True)
    for src in sources:
        cut = _slim(nsys_seed(src, native.BUILD / "cut.sqlite", rows=20)).read_bytes()
        if len(cut) <= MAX_LEN["sqlscan"]:
            (out / hashlib.sha1(cut).hexdigest()).write_bytes(cut)
    return out


def _slim(path: Path) -> Path:
    """An export cut to the tables ``fuzz_sqlscan`` queries and its first 400 strings."""
    import sqlite3

    con = sqlite3.connect(path)
    try:
        keep = {"StringIds", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"}
        for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
            if t not in keep:
                con.execute(f'DROP TABLE "{t}"')
        con.execute("DELETE FROM StringIds WHERE rowid NOT IN (SELECT rowid FROM StringIds ORDER BY rowid LIMIT 400)")
        con.commit()
        con.execute("VACUUM")
    finally:
        con.close()
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["kscan", "sqlscan", "walk", "replay", "seed"])
    ap.add_argument("rest", nargs="*", help="replay: the parser, then the files")
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="crashes into crashers/, new coverage merged into corpus/")
    args, extra = ap.parse_known_args(argv)
    if (why := native.missing()) is not None:
        print(f"run.py: cannot fuzz here: {why}", file=sys.stderr)
        return 2
    if args.what == "seed":
        seed()
        return 0
    if args.what == "replay":
        return replay(args.rest[0], args.rest[1:])
    return fuzz(args.what, args.seconds, args.jobs, args.keep, extra)


if __name__ == "__main__":
    sys.exit(main())
