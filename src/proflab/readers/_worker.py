"""A helper process that decodes part of a large plain-JSON trace, so reading uses two cores.

The reader starts it as ``python -m proflab.readers._worker TRACE OUTDIR`` (a fresh
interpreter: nothing of the caller's process, threads or ``__main__`` is inherited) and
writes the slices to decode to its stdin as JSON ``[[begin, stop], ...]``. The worker maps
the same file, decodes those slices with the reader's own code, and leaves its tables in
OUTDIR as Arrow IPC, three files per slice (``gpu-N.arrow``, ``cpu-N.arrow``, ``comms-N.arrow``), with
``meta.json``. It exits non-zero on
any failure; the reader then decodes those slices itself.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

__all__ = ["main"]


def main(argv: list[str]) -> int:
    import gc

    from proflab.readers import kineto
    from proflab.readers._slices import open_slicer

    gc.disable()  # see kineto._no_gc
    trace, outdir = Path(argv[0]), Path(argv[1])
    ranges = json.loads(sys.stdin.buffer.read())
    slicer = open_slicer(trace, kineto._CHUNK_BYTES)
    unknown: dict[str, int] = {}
    problems: dict[tuple, int] = {}
    events = 0
    try:
        for i, (begin, stop) in enumerate(ranges):
            piece = slicer.piece(begin, stop)
            t = kineto._slice_tables(piece)
            slicer.done(piece)
            # written and dropped slice by slice: the helper holds one slice's tables at most
            t.gpu.write_ipc(outdir / f"gpu-{i}.arrow")
            t.cpu.write_ipc(outdir / f"cpu-{i}.arrow")
            t.comms.write_ipc(outdir / f"comms-{i}.arrow")
            events += t.events
            for cat, n in t.unknown.items():
                unknown[cat] = unknown.get(cat, 0) + n
            for key, n in t.problems.items():
                problems[key] = problems.get(key, 0) + n
            del t
    finally:
        slicer.close()
    meta = {
        "events": events,
        "unknown": unknown,
        "problems": [[*key, n] for key, n in problems.items()],
        "slices": len(ranges),
    }
    (outdir / "meta.json").write_text(json.dumps(meta))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
