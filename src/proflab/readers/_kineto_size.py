"""How large a Kineto trace's JSON is, and what reading and analysing it whole is estimated to
peak at, from the standard library alone.

Nothing here imports polars: the CLI sizes polars' allocator setting from the estimate before
polars starts (``proflab.cli``), as it does for an export from ``_export_rows``, and the
memory budget (``readers.budget``) and the reader use the same numbers.
"""

from __future__ import annotations

import os

__all__ = ["SLICE_BYTES", "WIDE_FROM_BYTES", "HELPER_FROM_SLICES", "HELPER_FROM_BYTES", "KINETO_FIXED", "KINETO_EVENT", "KINETO_ALONE_EVENT",
           "helper_allowed", "looks_like_kineto", "json_bytes", "need"]  # fmt: skip

# Slices of 16 MiB: each process holds one slice's decoded events at a time, and 32 MiB ones
# held twice that. The two processes reading a 514 MB trace peaked at 484-490 MiB together
# (bound 482), now 396-404, in the same time (2.80-3.18 s against 2.90-3.24, alternating).
SLICE_BYTES = 16 << 20
# Where two threads of this process decode them (the compiled decoder), a plain file of 256
# MiB or more is cut in slices twice as wide (``kineto._slice_bytes``): eight of them at least.
WIDE_FROM_BYTES = 256 << 20

# A trace of at least this many slices (192 MiB) is shared with a helper process on a
# machine with two or more cores. A second interpreter with polars costs ~110 MiB more at
# once, against a memory bound (0.4 x the trace + 300 MB, the two processes' RSS together)
# that grows with the trace (measured when each had a fixed half): a 170 MB trace read alone
# peaks at 210 MiB in 1.38 s, with the helper at 318 MiB (bound 351, too close to share it)
# in 1.18 s; a 261 MB one 216 MiB in 1.82 s alone, 315 MiB (bound 386) in 1.56 s with it.
HELPER_FROM_SLICES = 12
HELPER_FROM_BYTES = HELPER_FROM_SLICES * SLICE_BYTES  # (a plain file; a gzip or xz one is decoded in one process)

# Peak RSS of a whole read and analysis of a Kineto trace, the reader and its helper process
# together (bench_scaling.py's realistic shapes, 2 cores: 65 MB to 1.5 GB), per event decoded
# and fixed: within the bound of 0.4 x the trace's bytes + 300 MB the whole path holds to.
KINETO_FIXED = 250_000_000
KINETO_EVENT = 150
# Read in one process (one core, or a trace under 12 slices), a whole read and analysis
# costs 320 bytes an event (the 514 MB trace: 684 MB).
KINETO_ALONE_EVENT = 330
_BYTES_PER_EVENT = 300  # of JSON, at the fewest seen (real and generated traces: 300-350)
_GZIP_MAGIC = b"\x1f\x8b"
_XZ_MAGIC = b"\xfd7zXZ\x00"  # (as ``_slices``'s, which is not imported: it imports numpy)
# An xz file whose index cannot be read is taken to hold this many times its bytes of JSON:
# more than Kineto's JSON compresses at xz -9e (the committed traces: 18-31x), so the
# estimate errs on the large side, as the memory budget wants.
_XZ_RATIO = 40


def helper_allowed() -> bool:
    """A second reader on multi-core machines (a thread with the compiled decoder, else a
    helper process); PROFLAB_READ_PROCESSES=1 reads in one."""
    if os.environ.get("PROFLAB_READ_PROCESSES", "").strip() == "1":
        return False
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores >= 2


def looks_like_kineto(path) -> bool:
    """Whether the file opens as gzip, xz or JSON (its first byte other than white space is
    ``{`` or ``[``): what the Kineto reader would try to read. Not whether it is a trace."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return head.startswith((_GZIP_MAGIC, _XZ_MAGIC)) or head.lstrip()[:1] in (b"{", b"[")


def json_bytes(path) -> tuple[int, bool]:
    """(bytes of JSON, whether the file is compressed: gzip or xz). A gzip file's uncompressed
    size is read from its trailer (modulo 4 GiB there: taken as at least 4x the compressed
    bytes, less than Kineto's JSON compresses); an xz file's from its streams' indexes
    (``_xz_bytes``). Raises OSError where the file cannot be read."""
    size = os.stat(path).st_size
    with open(path, "rb") as f:
        magic = f.read(len(_XZ_MAGIC))
        if magic == _XZ_MAGIC:
            return _xz_bytes(f, size), True
        if not magic.startswith(_GZIP_MAGIC) or size < 18:
            return size, False
        f.seek(-4, os.SEEK_END)
        raw = int.from_bytes(f.read(4), "little")
    while raw < 4 * size:
        raw += 1 << 32
    return raw, True


def _xz_bytes(f, size: int) -> int:
    """The uncompressed bytes of an xz file (``f``, ``size`` bytes long): the sum over its
    streams, last to first, of the sizes their indexes record, each stream found from its
    footer (the index's size) and the index (its blocks' sizes). Where that does not add up
    (a damaged or truncated file, an index of absurd length), ``_XZ_RATIO`` times the file's
    size; the read then says what is wrong."""
    total, end = 0, size
    try:
        while end > 0:
            f.seek(max(end - 4096, 0))
            tail = f.read(end - max(end - 4096, 0))
            padded = len(tail) - len(tail.rstrip(b"\0"))  # stream padding: nulls, 4 at a time
            end -= padded - padded % 4
            if end < 24 or padded % 4:
                raise ValueError
            f.seek(end - 12)
            footer = f.read(12)
            if footer[10:] != b"YZ":
                raise ValueError
            index_bytes = (int.from_bytes(footer[4:8], "little") + 1) * 4
            if index_bytes > end - 24:
                raise ValueError
            f.seek(end - 12 - index_bytes)
            blocks, raw = _xz_index(f.read(index_bytes))
            end -= 12 + index_bytes + blocks + 12  # footer, index, blocks, header
            if end < 0:
                raise ValueError
            f.seek(end)
            if f.read(len(_XZ_MAGIC)) != _XZ_MAGIC:
                raise ValueError
            total += raw
    except ValueError:
        return _XZ_RATIO * size
    return total


def _xz_index(index: bytes) -> tuple[int, int]:
    """(bytes of the stream's blocks, padded to 4 as they lie in the file; their
    uncompressed bytes) from an xz index: a null indicator, the number of records, and per
    block its unpadded and its uncompressed size, each a variable-length integer (7 bits a
    byte, least significant first). Raises ValueError where it is not one."""
    if index[:1] != b"\0":
        raise ValueError
    at = 1

    def varint() -> int:
        nonlocal at
        value = 0
        for shift in range(0, 63, 7):  # at most 9 bytes
            if at >= len(index):
                raise ValueError
            byte = index[at]
            at += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
        raise ValueError

    records = varint()
    if records > len(index) // 2:
        raise ValueError
    blocks = raw = 0
    for _ in range(records):
        unpadded = varint()
        raw += varint()
        blocks += -(-unpadded // 4) * 4
    return blocks, raw


def need(path, events: int | None = None) -> int:
    """The estimated peak (bytes) of reading and analysing a Kineto trace whole: from its
    ``events`` where they are counted, else from its size; and by whether a second reader
    decodes half of it (a plain file of ``HELPER_FROM_SLICES`` slices or more, on two or more
    cores). Raises OSError where the file cannot be read."""
    size, compressed = json_bytes(path)
    shared = not compressed and size >= HELPER_FROM_BYTES and helper_allowed()
    events = size // _BYTES_PER_EVENT if events is None else events
    return KINETO_FIXED + (KINETO_EVENT if shared else KINETO_ALONE_EVENT) * events
