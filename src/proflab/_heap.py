"""The C library's heap, where numpy takes its arrays: how the analysis commands keep it small.

glibc maps a block above a threshold on its own and unmaps it when freed, but raises that
threshold (up to 32 MiB), and the free heap it keeps (twice that), each time such a block is
freed: the arrays allocated after that come from its heap, where freed memory stays with the
process, and an analysis of millions of events would hold what it freed at its largest.

The analysis commands fix the threshold (:func:`fix_threshold`) at 8 MiB: a larger array is
mapped and unmapped; the smaller ones, a chunk's temporaries that loops allocate again and
again, are reused from the heap with no new pages; and each analysis table, once built, gives
the heap's free memory back (:func:`release`, ``malloc_trim``). On the 1048 MB export, against
a threshold of 1 MiB and no release: 2.95 -> 2.36-2.40 M page faults, 5.2-6.0 -> 4.4-4.9 s of
system time, 10.8-11.5 -> 10.0-10.8 s, the same peak (1,393 -> 1,398 MiB); 8 MiB with no
release peaked at 1,497 MiB.

A fixed threshold also stops glibc raising its trim threshold with it: the heap gave back any
free top above its default 128 KiB at each ``free``, so an array of a few hundred KiB (the
what-if's plans: a column of a step graph's operations) faulted its pages in anew each time
it was made. :func:`fix_threshold` keeps up to 4 MiB of free top (``_TRIM_THRESHOLD``). The
70 MB TinyLlama trace, ``analyze -f json --no-cache``, four alternating runs: 121-126 k ->
85-89 k page faults, 1.45-1.70 -> 1.19-1.62 s; the 514 MB benchmark trace, three: 241-250 k
-> 224-231 k, 2.43-2.70 -> 2.30-2.32 s, the same peak (442-450 -> 442-453 MiB; 16 MiB of
free top kept: 456-476 MiB).

Nothing is done where the C library is not glibc (no ``mallopt``), or where the user set
``MALLOC_MMAP_THRESHOLD_``: then :func:`release` does nothing either.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

__all__ = ["fix_threshold", "release", "slices_reused"]

_M_MMAP_THRESHOLD = -3  # glibc's malloc.h
_M_TRIM_THRESHOLD = -1
THRESHOLD = 8 << 20
_TRIM_THRESHOLD = 4 << 20  # the free top the heap keeps once the threshold is fixed (the module's note)
_trim = None  # malloc_trim, once the threshold is fixed
_mallopt = None


def fix_threshold() -> None:
    global _trim, _mallopt
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        mallopt, trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):
        return
    if mallopt(_M_MMAP_THRESHOLD, THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD):
        trim.argtypes = [ctypes.c_size_t]
        _trim, _mallopt = trim, mallopt


def release() -> None:
    """Give the heap's free memory back to the system (a few ms with the heap this small)."""
    if _trim is not None:
        _trim(0)


_SLICE_THRESHOLD = 32 << 20  # glibc's largest
_SLICE_TRIM = 64 << 20


@contextmanager
def slices_reused():
    """While a trace's slices are read: blocks up to 32 MiB come from the heap, so each
    slice's buffers (its 16 MiB of JSON, its decoded records, a .gz file's decompressed
    reads) reuse the last slice's pages instead of being mapped afresh, and the heap's free
    memory is given back after (the threshold fixed again). Only where the threshold was
    fixed (:func:`fix_threshold`). ``proflab analyze T -f json --no-cache`` of the 514 MB
    trace: 0.67 -> 0.45 M page faults, 2.85 -> 2.69 s, the same 379 MiB peak; as a .gz:
    1.26 -> 0.49 M, 4.76 -> 3.50 s, 380 -> 399 MiB."""
    if _trim is None or not _mallopt(_M_MMAP_THRESHOLD, _SLICE_THRESHOLD):
        yield
        return
    _mallopt(_M_TRIM_THRESHOLD, _SLICE_TRIM)  # (a freed block on the heap's top is kept too)
    try:
        yield
    finally:
        _mallopt(_M_MMAP_THRESHOLD, THRESHOLD)
        _mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
        release()
