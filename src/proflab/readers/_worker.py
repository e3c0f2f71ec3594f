"""A helper process that decodes part of a large plain-JSON trace, so reading uses two cores.

The reader starts it as ``python -m proflab.readers._worker TRACE OUTDIR`` (a fresh
interpreter: nothing of the caller's process, threads or ``__main__`` is inherited) and
writes every slice of the file to its stdin as JSON ``[[begin, stop], ...]``. The two share
the slices as they go: the reader decodes from the first slice on, the worker from the last
one back, and each slice is taken by whoever first creates its claim file in OUTDIR
(``_slices.claim``, an exclusive create: exactly one of them gets it). Each stops at the first
slice the other holds, so the reader ends up with the slices before some point and the
worker with those after it, however their speeds differ. (A fixed half each left the reader
idle for 0.5 s of a real 497 MB trace, whose later slices cost more to decode: 2.95 -> 2.66 s.)

The worker maps the same file, decodes its slices with the reader's own code, and leaves
their tables in OUTDIR as Arrow IPC, three files per slice (``gpu-N.arrow``, ``cpu-N.arrow``,
``comms-N.arrow``, N the slice's index), with ``meta.json``: the first slice it decoded
(``first``; the count of slices when it got none) and each slice's event count, unrecognised
categories and tolerant-decoding problems. It exits non-zero on any failure; the reader then
decodes the worker's slices itself.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

__all__ = ["main"]


def main(argv: list[str]) -> int:
    import gc

    from proflab.readers import kineto
    from proflab.readers._slices import claim, open_slicer

    gc.disable()  # see kineto._no_gc
    trace, outdir = Path(argv[0]), Path(argv[1])
    ranges = json.loads(sys.stdin.buffer.read())
    slicer = open_slicer(trace, kineto._CHUNK_BYTES)
    done: dict[int, dict] = {}
    try:
        for i in range(len(ranges) - 1, -1, -1):
            if not claim(outdir, i):
                break  # the reader holds this slice and every one before it
            piece = slicer.piece(*ranges[i])
            t = kineto._slice_tables(piece)
            slicer.done(piece)
            # written and dropped slice by slice: the helper holds one slice's tables at most
            t.gpu.write_ipc(outdir / f"gpu-{i}.arrow")
            t.cpu.write_ipc(outdir / f"cpu-{i}.arrow")
            t.comms.write_ipc(outdir / f"comms-{i}.arrow")
            done[i] = {"events": t.events, "unknown": dict(t.unknown), "problems": [[*key, n] for key, n in t.problems.items()]}
            del t
    finally:
        slicer.close()
    first = min(done, default=len(ranges))
    meta = {"first": first, "slices": [done[i] for i in range(first, len(ranges))]}
    (outdir / "meta.json").write_text(json.dumps(meta))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
