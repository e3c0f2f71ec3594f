"""A helper process that decodes part of a large plain-JSON trace, so reading uses two cores.

The reader starts it as ``python -m proflab.readers._worker TRACE OUTDIR`` (a fresh
interpreter: nothing of the caller's process, threads or ``__main__`` is inherited) and
writes the slices to decode to its stdin as JSON ``[[begin, stop], ...]``. The worker maps
the same file, decodes those slices with the reader's own code, and leaves its tables in
OUTDIR as Arrow IPC (``gpu.arrow``, ``cpu.arrow``) with ``meta.json``. It exits non-zero on
any failure; the reader then decodes those slices itself.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

__all__ = ["main"]


def main(argv: list[str]) -> int:
    import gc

    import polars as pl

    from proflab.readers import kineto
    from proflab.readers._slices import open_slicer

    gc.disable()  # see kineto._no_gc
    trace, outdir = Path(argv[0]), Path(argv[1])
    ranges = json.loads(sys.stdin.buffer.read())
    slicer = open_slicer(trace, kineto._CHUNK_BYTES)
    try:
        tables = []
        for begin, stop in ranges:
            piece = slicer.piece(begin, stop)
            tables.append(kineto._slice_tables(piece))
            slicer.done(piece)
    finally:
        slicer.close()
    pl.concat([t.gpu for t in tables]).write_ipc(outdir / "gpu.arrow")
    pl.concat([t.cpu for t in tables]).write_ipc(outdir / "cpu.arrow")
    unknown: dict[str, int] = {}
    for t in tables:
        for cat, n in t.unknown.items():
            unknown[cat] = unknown.get(cat, 0) + n
    problems: dict[tuple, int] = {}
    for t in tables:
        for key, n in t.problems.items():
            problems[key] = problems.get(key, 0) + n
    meta = {
        "events": sum(t.events for t in tables),
        "unknown": unknown,
        "problems": [[*key, n] for key, n in problems.items()],
    }
    (outdir / "meta.json").write_text(json.dumps(meta))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
