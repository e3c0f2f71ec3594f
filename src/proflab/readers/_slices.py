"""Cut a Kineto JSON document into decodable slices of events while it streams in.

Kineto writes ``"traceEvents": [`` and then one event per block, each starting with a
newline and two spaces before ``{``. JSON strings cannot hold a raw newline, so that pattern
only ever occurs between events, and the stream can be cut there without parsing it. Each
slice is returned as its own small JSON array; the document around the array (device
properties, versions...) is kept as ``head`` + ``[]`` + ``tail``.

Memory stays at one slice plus one read chunk, however large the trace (plain or gzip).
A stream that does not have this layout raises :class:`NotSliceable`; the reader then
decodes the whole document, which also produces the precise error for broken input.
"""

from __future__ import annotations

import mmap
import os
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from proflab.errors import CorruptInput, TruncatedInput

__all__ = ["NotSliceable", "Slicer", "MappedSlicer", "open_slicer", "byte_chunks", "claim", "GZIP_MAGIC"]

GZIP_MAGIC = b"\x1f\x8b"
EVENT_START = b"\n  {"
_BLANK = b" \t\r\n"
_COMMA, _OPEN, _CLOSE = ord(","), ord("["), ord("]")
_READ_BYTES = 16 << 20
# Decompressed a quarter slice at a time: the slicer's buffer then holds at most a quarter
# slice past a cut, so the buffer itself can become the slice (``Slicer._take``). Whole
# reads at a time left a cut with ~16 MiB after it: each slice was copied out of the buffer,
# or held 31 MiB as the buffer. The 514 MB trace's .gz inflated and sliced on a thread:
# 0.67-0.72 -> 0.45-0.51 s, slices of at most 19 MiB; its whole analysis the same 2.17 s
# (median of eight, interleaved), its peak 447 -> 425 MiB.
_INFLATED_BYTES = 4 << 20
_MAX_HEAD_BYTES = 64 << 20
_MAX_TAIL_BYTES = 4 << 20


class NotSliceable(Exception):
    """The stream is not in Kineto's layout (or not JSON at all)."""


def byte_chunks(path: Path) -> Iterator[bytes]:
    """The file's bytes in chunks, gunzipped on the fly when compressed."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise CorruptInput(path, f"cannot read: {e.strerror or e}") from e
    with f:
        first = f.read(_READ_BYTES)
        if not first.startswith(GZIP_MAGIC):
            while first:
                yield first
                first = f.read(_READ_BYTES)
            return
        pending = first
        inflate, errors = _inflater()
        d = inflate(wbits=31)
        try:
            while True:
                if not pending:
                    pending = f.read(_READ_BYTES)
                    if not pending:
                        out = d.flush() if not d.eof else b""  # what zlib still holds
                        if out:
                            yield out
                        if d.eof:
                            return
                        raise TruncatedInput(path, "gzip stream ends early (truncated .gz file)")
                if d.eof:  # a .gz file may hold several members
                    if not pending.startswith(GZIP_MAGIC):
                        return  # trailing garbage after the last member is ignored, as gzip does
                    d = inflate(wbits=31)
                # at most a read's worth out at a time: a JSON trace compresses ~10x, and a
                # whole 16 MiB read decompressed at once held 160 MiB (1.45 GB peak at 514 MB)
                out = d.decompress(pending, min(_READ_BYTES, _INFLATED_BYTES))
                pending = d.unused_data if d.eof else d.unconsumed_tail
                if out:
                    yield out
        except errors as e:
            raise CorruptInput(path, f"corrupt gzip data ({e})") from e


def _inflater() -> tuple[Callable[..., Any], tuple[type[Exception], ...]]:
    """zlib's ``decompressobj`` and the errors it raises: ISA-L's (``isal``), which inflates
    the 514 MB trace's 50 MB .gz in 0.33 s where zlib takes 0.75, or zlib's where isal is not
    installed (a machine it has no wheel for) or ``PROFLAB_ZLIB=1`` asks for it."""
    if os.environ.get("PROFLAB_ZLIB", "") not in ("", "0"):
        return zlib.decompressobj, (zlib.error,)
    try:
        from isal import isal_zlib
    except ImportError:
        return zlib.decompressobj, (zlib.error,)
    return isal_zlib.decompressobj, (isal_zlib.error, zlib.error)


def open_slicer(path: Path, slice_bytes: int) -> Slicer | MappedSlicer:
    """A mapped slicer for a plain file (no copies), a streaming one for gzip."""
    try:
        with open(path, "rb") as f:
            magic = f.read(2)
            if magic and magic != GZIP_MAGIC:
                return MappedSlicer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY), slice_bytes)
    except (OSError, ValueError):
        pass
    return Slicer(slice_bytes, path)


class MappedSlicer:
    """Slices of a memory-mapped plain file, bracketed in place on a private (copy-on-write)
    mapping: no byte is copied, and the pages of a decoded slice are handed back to the OS
    (``done``), so resident memory stays near one slice whatever the file size."""

    def __init__(self, mm: mmap.mmap, slice_bytes: int) -> None:
        self.mm = mm
        self.view = memoryview(mm)
        self.slice_bytes = slice_bytes
        self.size = len(mm)
        self.head: bytes | None = None
        self.tail: bytes | None = None
        self._starts: dict[int, int] = {}  # id(slice view) -> offset, for done()

    def plan(self) -> list[tuple[int, int]]:
        """Every slice as (begin, stop): the offsets of its opening newline and of the comma
        (or the array's ``]``) after its last event. Also reads ``head`` and ``tail``."""
        mm = self.mm
        found = _array_start(mm)
        if found is None:
            raise NotSliceable
        start, first = found
        close = _array_close(mm)
        if close < first:
            raise NotSliceable
        self.head, self.tail = mm[:start], mm[close + 1 :]
        ranges = []
        begin = first
        while begin < close:
            cut = mm.find(EVENT_START, begin + self.slice_bytes, close)
            if cut < 0:
                cut = stop = close
            else:
                stop = _stop_before(mm, cut)
            ranges.append((begin, stop))
            begin = cut
        return ranges

    def piece(self, begin: int, stop: int) -> memoryview:
        """The slice as a JSON array, bracketed in place (no copy)."""
        self.mm[begin], self.mm[stop] = _OPEN, _CLOSE
        view = self.view[begin : stop + 1]
        self._starts[id(view)] = begin
        return view

    def pieces(self) -> Iterator[memoryview]:
        for begin, stop in self.plan():
            yield self.piece(begin, stop)

    def done(self, piece: memoryview) -> None:
        """Release a decoded slice and drop its whole pages (not the ones it shares with its
        neighbours, whose brackets live there)."""
        start = self._starts.pop(id(piece), None)
        n = piece.nbytes
        piece.release()
        if start is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        page = mmap.PAGESIZE
        lo = (start // page + 1) * page
        hi = ((start + n) // page) * page
        if hi > lo:
            try:
                self.mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
            except OSError:
                pass

    def document(self) -> bytes:
        return (self.head or b"") + b"[]" + (self.tail or b"")

    def close(self) -> None:
        self.view.release()
        try:
            self.mm.close()
        except BufferError:  # a slice still referenced somewhere: let GC unmap it
            pass


def _skip_blank(buf, i: int) -> int:
    while i < len(buf) and buf[i] in _BLANK:
        i += 1
    return i


def _array_start(buf) -> tuple[int, int] | None:
    """(offset of the events array's ``[``, offset of its first event), or None when the
    buffer does not reach the first event yet. Anything but blanks between: NotSliceable."""
    key = buf.find(b'"traceEvents"')
    start = buf.find(b"[", key) if key >= 0 else -1
    first = buf.find(EVENT_START, start) if start >= 0 else -1
    if first < 0:
        return None
    if any(c not in _BLANK for c in buf[start + 1 : first]):
        raise NotSliceable
    return start, first


def _array_close(buf) -> int:
    """Offset of the ``]`` closing the events array: after the last event, blanks and at
    most one comma."""
    # Top-level objects written after the array (a "distributedInfo" block) end in the same
    # "\n  }": step back over them, as far as the last few MiB of the document.
    end = len(buf)
    floor = max(0, len(buf) - _MAX_TAIL_BYTES)
    while True:
        last = buf.rfind(b"\n  }", floor, end)
        if last < 0:
            raise NotSliceable
        close = _skip_blank(buf, last + 4)
        if close < len(buf) and buf[close] == _COMMA:
            close = _skip_blank(buf, close + 1)
        if close < len(buf) and buf[close] == _CLOSE:
            return close
        end = last


def _stop_before(buf, cut: int) -> int:
    """Offset of the comma that ends the event before the one starting at ``cut``."""
    stop = cut - 1
    while buf[stop] in _BLANK:
        stop -= 1
    if buf[stop] != _COMMA:
        raise NotSliceable
    return stop


class Slicer:
    """Streaming slicer for compressed input: yields bracketed ``bytearray`` slices of about
    ``slice_bytes`` while the file is decompressed chunk by chunk."""

    def __init__(self, slice_bytes: int, path: Path | None = None) -> None:
        self.path = path
        self.slice_bytes = slice_bytes
        self.buf = bytearray()
        self.head: bytes | None = None  # document up to the events array
        self.tail: bytes | None = None  # document after it
        self.size = 0

    def pieces(self) -> Iterator[bytearray]:
        for chunk in byte_chunks(self.path):
            yield from self.feed(chunk)
        yield from self.finish()

    def done(self, piece: bytearray) -> None:
        pass

    def close(self) -> None:
        self.buf = bytearray()

    def feed(self, chunk: bytes) -> Iterator[bytearray]:
        self.size += len(chunk)
        self.buf += chunk
        if self.head is None and not self._find_array():
            return
        while len(self.buf) >= self.slice_bytes:
            cut = self.buf.find(EVENT_START, self.slice_bytes)
            if cut < 0:
                return
            yield self._take(_stop_before(self.buf, cut), cut)

    def finish(self) -> Iterator[bytearray]:
        if self.head is None:
            raise NotSliceable
        close = _array_close(self.buf)
        self.tail = bytes(self.buf[close + 1 :])
        yield self._take(close, len(self.buf))

    def document(self) -> bytes:
        """The JSON document with an empty events array, for its top-level fields."""
        return (self.head or b"") + b"[]" + (self.tail or b"")

    def _find_array(self) -> bool:
        found = _array_start(self.buf)
        if found is None:
            if len(self.buf) > _MAX_HEAD_BYTES:
                raise NotSliceable
            return False
        start, first = found
        self.head = bytes(self.buf[:start])
        del self.buf[:first]
        return True

    def _take(self, stop: int, cut: int) -> bytearray:
        """``buf[:stop+1]`` as an array (its leading newline becomes ``[``, the byte at
        ``stop`` — a comma or the array's own ``]`` — becomes ``]``); drop ``buf[:cut]``.
        The buffer itself becomes the slice, cut short in place, and only what follows the
        cut (less than a decompressed piece, ``_INFLATED_BYTES``) is copied into a new one;
        where more follows than the slice holds (slices smaller than a piece), the slice is
        copied out instead."""
        if len(self.buf) - cut > stop:
            out = self.buf[: stop + 1]
            del self.buf[:cut]
        else:
            out, self.buf = self.buf, self.buf[cut:]
            del out[stop + 1 :]
        out[0], out[stop] = _OPEN, _CLOSE
        return out


# The reader and its helper process (``_worker``) share a file's slices by claim files in one
# folder: whoever creates a slice's claim first decodes it.
def claim(folder: Path, index: int) -> bool:
    """Take slice ``index`` for the calling process: True when this call created its claim
    file, False when the other process holds it."""
    try:
        os.close(os.open(folder / f"claim-{index}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    return True
