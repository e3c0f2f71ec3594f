"""Cut a Kineto JSON document into decodable slices of events while it streams in.

Kineto writes ``"traceEvents": [`` and then one event per block, each starting with a
newline and two spaces before ``{``. JSON strings cannot hold a raw newline, so that pattern
only ever occurs between events, and the stream can be cut there without parsing it. Each
slice is returned as its own small JSON array; the document around the array (device
properties, versions...) is kept as ``head`` + ``[]`` + ``tail``.

Memory stays at one slice plus one read chunk, however large the trace (plain, gzip or xz).
Any other layout of valid JSON (one compact event a line, ``indent=2``, all on one line, the
Chrome "JSON array" form) is cut by a scan of its structure (:class:`_Structure`): the
strings (quotes not escaped by an odd run of backslashes) and the nesting depth outside them
give the events array and the commas between its elements, a read at a time with the state
carried over. Such a slice is copied out with its brackets added (its neighbours share the
comma between them). A stream that is not JSON with a ``traceEvents`` array (or an
array of events) raises :class:`NotSliceable`; the reader then decodes the whole document,
which also produces the precise error for broken input.
"""

from __future__ import annotations

import importlib
import mmap
import os
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from proflab.errors import CorruptInput, TruncatedInput

try:  # (by name, as readers._kineto_native imports it)
    _kscan = importlib.import_module("proflab.readers._kscan")
except ImportError:  # built without a C compiler: numpy scans the structure
    _kscan = None
if _kscan is not None and not hasattr(_kscan, "structure"):
    _kscan = None  # a build from before the structure scan (an install not rebuilt): numpy scans it

__all__ = ["NotSliceable", "Slicer", "MappedSlicer", "open_slicer", "byte_chunks", "claim", "GZIP_MAGIC", "XZ_MAGIC", "boundaries"]

GZIP_MAGIC = b"\x1f\x8b"
XZ_MAGIC = b"\xfd7zXZ\x00"
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
# The structure scan's read (``_Structure.feed``): its temporaries are ~9 bytes a byte read
# (the structural characters' and quotes' offsets, their parities and depths, as int64), so a
# read of 16 MiB held ~150 MiB at once, one of 4 MiB ~40, one of 1 MiB ~10. A gzip stream's
# inflated pieces (``_INFLATED_BYTES``) are scanned this much at a time too.
_SCAN_BYTES = 1 << 20
_MAX_HEAD_BYTES = 64 << 20
_MAX_TAIL_BYTES = 4 << 20


class NotSliceable(Exception):
    """The stream is not in Kineto's layout (or not JSON at all)."""


def byte_chunks(path: Path) -> Iterator[bytes]:
    """The file's bytes in chunks, decompressed on the fly when gzip or xz."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise CorruptInput(path, f"cannot read: {e.strerror or e}") from e
    with f:
        first = f.read(_READ_BYTES)
        if first.startswith(XZ_MAGIC):
            yield from _unxz(f, first, path)
            return
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


def _unxz(f, pending: bytes, path: Path) -> Iterator[bytes]:
    """An xz file's bytes decompressed from ``f`` (read up to ``pending``, its first read),
    at most ``_INFLATED_BYTES`` at a time as for gzip: an xz trace compresses ~25x. Streams
    one after another (with the null padding xz allows between them) are read on; anything
    else after the last is ignored, as for gzip."""
    import lzma

    d = lzma.LZMADecompressor(lzma.FORMAT_XZ)
    try:
        while True:
            if d.eof:
                rest = d.unused_data.lstrip(b"\0")
                while len(rest) < len(XZ_MAGIC) and (more := f.read(_READ_BYTES)):
                    rest = (rest + more).lstrip(b"\0")
                if not rest.startswith(XZ_MAGIC):
                    return
                d, pending = lzma.LZMADecompressor(lzma.FORMAT_XZ), rest
            elif d.needs_input and not pending:
                pending = f.read(_READ_BYTES)
                if not pending:
                    raise TruncatedInput(path, "xz stream ends early (truncated .xz file)")
            out = d.decompress(pending, min(_READ_BYTES, _INFLATED_BYTES))
            pending = b""
            if out:
                yield out
    except lzma.LZMAError as e:
        raise CorruptInput(path, f"corrupt xz data ({e})") from e


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


def open_slicer(path: Path, slice_bytes: int, *, general: bool = False) -> Slicer | MappedSlicer:
    """A mapped slicer for a plain file (no copies in Kineto's layout), a streaming one for
    gzip or xz. ``general``: a streaming one cuts by the document's structure from the start (its
    Kineto-layout cut raised NotSliceable part way: the caller reads it again this way); a
    mapped one falls back by itself."""
    try:
        with open(path, "rb") as f:
            magic = f.read(len(XZ_MAGIC))
            if magic and not magic.startswith((GZIP_MAGIC, XZ_MAGIC)):
                return MappedSlicer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY), slice_bytes)
    except (OSError, ValueError):
        pass
    return Slicer(slice_bytes, path, general=general)


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
        """Every slice as (begin, stop): in Kineto's layout the offsets of its opening newline
        and of the comma (or the array's ``]``) after its last event; in any other, of the
        ``[`` or comma before its first event and the comma or ``]`` after its last
        (``piece`` tells them apart by the first: a blank or not). Also reads ``head`` and
        ``tail``."""
        try:
            return self._kineto_plan()
        except NotSliceable:
            return self._general_plan()

    def _general_plan(self) -> list[tuple[int, int]]:
        """The plan from the document's structure (``boundaries``), a read at a time."""
        open_at, ranges, close, self.array_form, last_sep = boundaries(self._scanned(), self.slice_bytes)
        self.head, self.tail = bytes(self.mm[:open_at]), bytes(self.mm[close + 1 :])
        begin = ranges[-1][0]
        if begin <= last_sep and not self.mm[last_sep + 1 : close].strip():
            # a comma right before the ']' (as Kineto once wrote): it ends the last slice
            ranges[-1:] = [] if last_sep == begin and len(ranges) > 1 else [(begin, last_sep)]
        return ranges

    def _scanned(self) -> Iterator[memoryview]:
        """The file a read at a time for the structure scan, each read's pages handed back once
        scanned: the scan touches every byte, and the mapped pages it left counted in the
        resident set until the slice holding them was decoded. Nothing is written to the
        mapping before the plan is made, so no page dropped holds a change."""
        for at in range(0, self.size, _SCAN_BYTES):
            yield self.view[at : at + _SCAN_BYTES]
            self._drop(at, at + _SCAN_BYTES)

    def _kineto_plan(self) -> list[tuple[int, int]]:
        mm = self.mm
        self.array_form = False
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

    def piece(self, begin: int, stop: int) -> memoryview | bytearray:
        """The slice as a JSON array: bracketed in place (no copy) in Kineto's layout, where
        ``begin`` is the blank before its first event; else copied out between the
        separators at ``begin`` and ``stop`` (a neighbour holds each), brackets added."""
        if self.mm[begin] not in _BLANK:
            out = bytearray(stop - begin + 1)
            out[1:-1] = self.view[begin + 1 : stop]
            out[0], out[-1] = _OPEN, _CLOSE
            # the copy holds the bytes now: the mapped pages go back at once (nothing is written
            # to the mapping in this layout, so a neighbour's page read again is the file's)
            self._drop(begin + 1, stop)
            return out
        self.mm[begin], self.mm[stop] = _OPEN, _CLOSE
        view = self.view[begin : stop + 1]
        self._starts[id(view)] = begin
        return view

    def pieces(self) -> Iterator[memoryview]:
        for begin, stop in self.plan():
            yield self.piece(begin, stop)

    def done(self, piece: memoryview | bytearray) -> None:
        """Release a decoded slice and drop its whole pages (not the ones it shares with its
        neighbours, whose brackets live there)."""
        if not isinstance(piece, memoryview):
            return  # a copy: nothing of the mapping held
        start = self._starts.pop(id(piece), None)
        n = piece.nbytes
        piece.release()
        if start is not None:
            self._drop(start + 1, start + n)

    def _drop(self, lo: int, hi: int) -> None:
        """Hand back the mapping's whole pages within bytes [lo, hi) (their bytes are read again
        from the file if asked for)."""
        page = mmap.PAGESIZE
        lo, hi = -(-lo // page) * page, hi // page * page
        if hi > lo and hasattr(mmap, "MADV_DONTNEED"):
            try:
                self.mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
            except OSError:
                pass

    def document(self) -> bytes:
        if getattr(self, "array_form", False):
            return b'{"traceEvents":[]}'
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
    if start >= 0:  # an event not at Kineto's place (another layout) is known at once
        at = _skip_blank(buf, start + 1)
        if at < len(buf) and buf[at - 3 : at + 1] != EVENT_START:
            raise NotSliceable
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

    def __init__(self, slice_bytes: int, path: Path | None = None, *, general: bool = False) -> None:
        self.path = path
        self.slice_bytes = slice_bytes
        self.buf = bytearray()
        self.head: bytes | None = None  # document up to the events array
        self.tail: bytes | None = None  # document after it
        self.size = 0
        self.array_form = False
        # any layout: the structure scanned as the bytes come (``_Structure``); ``_base`` is
        # the stream offset of ``buf[0]``
        self._scan = _Structure() if general else None
        self._base = 0

    def pieces(self) -> Iterator[bytearray]:
        for chunk in byte_chunks(self.path):
            yield from self.feed(chunk)
        yield from self.finish()

    def done(self, piece: bytearray) -> None:
        pass

    def close(self) -> None:
        self.buf = bytearray()

    def feed(self, chunk: bytes) -> Iterator[bytearray]:
        if self._scan is not None:
            yield from self._feed_general(chunk)
            return
        self.size += len(chunk)
        self.buf += chunk
        if self.head is None and not self._find_array():
            return
        while len(self.buf) >= self.slice_bytes:
            cut = self.buf.find(EVENT_START, self.slice_bytes)
            if cut < 0:
                return
            yield self._take(_stop_before(self.buf, cut), cut)

    def _feed_general(self, chunk: bytes) -> Iterator[bytearray]:
        """Any layout: ``buf`` holds the stream from ``_base`` on, once the array opened from
        its ``[`` or the comma of the last cut; a slice is cut at the first comma of the array
        a slice's worth past that, the buffer itself becoming the slice (``_take``)."""
        scan = self._scan
        at = self.size
        self.size += len(chunk)
        self.buf += chunk
        view = memoryview(chunk)
        parts = [scan.feed(view[i : i + _SCAN_BYTES], at + i) for i in range(0, len(chunk), _SCAN_BYTES)]
        seps = np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else np.zeros(0, dtype=np.int64)
        if scan.open_at is None:
            if len(self.buf) > _MAX_HEAD_BYTES:
                raise NotSliceable
            return
        if self.head is None:  # the array opened: the head kept, the buffer from its '['
            cut = scan.open_at - self._base
            self.head = bytes(self.buf[:cut])
            self.array_form = scan.array_form
            del self.buf[:cut]
            self._base = scan.open_at
        while seps.size:
            j = int(np.searchsorted(seps, self._base + self.slice_bytes))
            if j >= seps.size:
                break
            cut = int(seps[j])
            # the buffer from its separator to the cut's comma is the slice (``_take``: its
            # separators become the brackets); the next starts at that comma. (A copy yielded
            # before the buffer let go of its bytes held the slice twice while it was decoded.)
            piece = self._take(cut - self._base, cut - self._base)
            self._base, seps = cut, seps[j + 1 :]
            yield piece

    def _last(self, stop: int) -> bytearray:
        """The buffer up to ``stop`` (the array's ``]`` or its trailing comma) as the last slice."""
        out, self.buf = self.buf, bytearray()
        del out[stop + 1 :]
        out[0], out[stop] = _OPEN, _CLOSE
        return out

    def _finish_general(self) -> Iterator[bytearray]:
        scan = self._scan
        scan.end()
        close, last = scan.close_at - self._base, scan.last_sep - self._base
        self.tail = bytes(self.buf[close + 1 :])
        if 0 <= last and not self.buf[last + 1 : close].strip():
            # a comma right before the ']' (as Kineto once wrote): it ends the last slice
            if last > 0 or self._base == scan.open_at:
                yield self._last(last)
            return
        yield self._last(close)

    def finish(self) -> Iterator[bytearray]:
        if self._scan is not None:
            yield from self._finish_general()
            return
        if self.head is None:
            raise NotSliceable
        close = _array_close(self.buf)
        self.tail = bytes(self.buf[close + 1 :])
        yield self._take(close, len(self.buf))

    def document(self) -> bytes:
        """The JSON document with an empty events array, for its top-level fields."""
        if self.array_form:
            return b'{"traceEvents":[]}'
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


# -- any layout: the document's structure ---------------------------------------------------------
_STRUCT = np.zeros(256, dtype=bool)
_STRUCT[list(b"{}[],:")] = True
_DEPTH = np.zeros(256, dtype=np.int64)
_DEPTH[list(b"{[")] = 1
_DEPTH[list(b"}]")] = -1
_NOT_BLANK = np.ones(256, dtype=bool)
_NOT_BLANK[list(_BLANK)] = False
_QUOTE, _BACKSLASH, _COLON = ord('"'), ord("\\"), ord(":")
_KEY = b'"traceEvents"'


class _Structure:
    """A JSON document's structure as its bytes stream in, a read at a time with its state
    carried over: inside a string or not (a quote after an odd run of backslashes is
    escaped), and the nesting depth outside strings; from those, the events array (the value
    of the top-level ``traceEvents``, or the top-level array itself, ``array_form``): its
    ``[`` (``open_at``), the commas between its elements (what ``feed`` returns) and its ``]``
    (``close_at``), as stream offsets. Until the array opens, a read costs a few passes of numpy
    over its bytes: its structural characters and quotes found, the quotes inside strings
    dropped by the running parity of those before them, the depth a running sum. Once it is
    open, one pass of the compiled decoder's ``structure`` gives the same state and commas
    (where it was built: else numpy's passes go on; 0.40 -> 0.10 s on a 70 MB compact trace).
    Raises NotSliceable where the document is not a JSON object holding such an array, nor an
    array."""

    def __init__(self, native: bool = True) -> None:
        # (False: numpy's scan, which the tests compare it with; PROFLAB_PURE_PYTHON=1 as for the decoder)
        self.native = native and _kscan is not None and os.environ.get("PROFLAB_PURE_PYTHON", "") in ("", "0")
        self.in_string = False
        self.backslashes = 0  # the run of backslashes the read before ended with
        self.depth = 0
        self.open_at: int | None = None
        self.close_at: int | None = None
        self.last_sep = -1  # the array's last comma so far
        self.array_form = False
        self._inner = 0  # the depth inside the events array
        self._want_array = False  # the key ended the read before: its value opens this one
        self._tail = b""  # the stream's last bytes before this read (a key across reads)
        self._started = False
        self._seen = False  # a structural character was seen

    def end(self) -> None:
        if self.in_string or self.depth != 0 or self.open_at is None or self.close_at is None:
            raise NotSliceable

    def feed(self, chunk, at: int) -> np.ndarray:
        """Scan ``chunk``, which starts at stream offset ``at``: the events array's commas in it."""
        none = np.zeros(0, dtype=np.int64)
        a = np.frombuffer(chunk, dtype=np.uint8)
        if a.size == 0:
            return none
        if not self._started:
            lead = np.flatnonzero(_NOT_BLANK[a])
            if lead.size == 0:
                return none
            self._started = True
            if a[lead[0]] not in (ord("{"), _OPEN):
                raise NotSliceable
        if self.native and self.open_at is not None:
            return self._feed_native(chunk, at)
        quotes = self._unescaped_quotes(a)
        # outside strings: an even count of string quotes before (odd where one was open), as a
        # running parity of the bytes (a search of every structural character among the quotes
        # cost 2.3x as much: the 154 MB compact trace's scan 1.0 -> 0.5 s)
        parity = np.zeros(a.size, dtype=np.uint8)
        parity[quotes] = 1
        np.bitwise_xor.accumulate(parity, out=parity)
        pos = np.flatnonzero(_STRUCT[a] & (parity == (1 if self.in_string else 0)))
        self.in_string = bool((quotes.size + (1 if self.in_string else 0)) % 2)
        seps = none
        if pos.size:
            ch = a[pos]
            before = self.depth + np.concatenate([[0], np.cumsum(_DEPTH[ch])[:-1]])
            self.depth = int(before[-1] + _DEPTH[ch[-1]])
            if (before < 0).any() or self.depth < 0:
                raise NotSliceable
            if self.close_at is None:
                seps = self._in_array(a, pos, ch, before, at)
        if self.open_at is None:
            self._tail = (self._tail + bytes(a[-32:]))[-32:]
        return seps

    def _feed_native(self, chunk, at: int) -> np.ndarray:
        """``feed`` once the array is open, in one compiled pass: the same state and commas."""
        found, close, self.in_string, self.backslashes, self.depth, broken = _kscan.structure(
            chunk, self.in_string, self.backslashes, self.depth, self._inner if self.close_at is None else -1)
        if broken:
            raise NotSliceable
        if close >= 0:
            self.close_at = at + close
        seps = np.frombuffer(found, dtype=np.int64) + at
        if seps.size:
            self.last_sep = int(seps[-1])
        return seps

    def _unescaped_quotes(self, a: np.ndarray) -> np.ndarray:
        """Offsets of the read's quotes that open or close a string (an odd run of
        backslashes before a quote escapes it; the run may begin in the read before)."""
        quotes = np.flatnonzero(a == _QUOTE)
        bs = np.flatnonzero(a == _BACKSLASH)
        carry, self.backslashes = self.backslashes, 0
        if bs.size == 0:
            if carry % 2 and quotes.size and quotes[0] == 0:
                quotes = quotes[1:]
            return quotes
        first = np.concatenate([[True], np.diff(bs) != 1])
        starts = bs[first]
        ends = np.append(bs[np.flatnonzero(first)[1:] - 1], bs[-1])
        runs = ends - starts + 1
        if starts[0] == 0:
            runs[0] += carry
        if ends[-1] == a.size - 1:
            self.backslashes = int(runs[-1])
        if quotes.size:
            i = np.minimum(np.searchsorted(ends, quotes - 1), ends.size - 1)
            n = np.where(ends[i] == quotes - 1, runs[i], 0)
            if carry:
                n = np.where(quotes == 0, carry, n)
            quotes = quotes[n % 2 == 0]
        return quotes

    def _in_array(self, a: np.ndarray, pos: np.ndarray, ch: np.ndarray, before: np.ndarray, at: int) -> np.ndarray:
        """Find the array (``_open``), then its commas and its close in this read."""
        if self.open_at is None:
            self._open(a, pos, ch, before, at)
            if self.open_at is None:
                return np.zeros(0, dtype=np.int64)
        inside = pos + at > self.open_at
        seps = pos[inside & (ch == _COMMA) & (before == self._inner)]
        ends = pos[inside & (ch == _CLOSE) & (before == self._inner)]
        if ends.size:
            self.close_at = at + int(ends[0])
            seps = seps[seps < ends[0]]
        seps = seps.astype(np.int64) + at
        if seps.size:
            self.last_sep = int(seps[-1])
        return seps

    def _open(self, a: np.ndarray, pos: np.ndarray, ch: np.ndarray, before: np.ndarray, at: int) -> None:
        """The array: the document itself where it starts with ``[``, else the value of the
        top-level key ``traceEvents`` (a colon at depth 1 after the key's quoted name, which
        follows the object's ``{`` or a comma), the next structural character."""
        if self._want_array:
            self._want_array = False
            if ch[0] != _OPEN or before[0] != 1:
                raise NotSliceable
            self.open_at, self._inner = at + int(pos[0]), 2
            return
        first = not self._seen
        self._seen = True
        if first and ch[0] == _OPEN:  # the document is the array itself
            self.open_at, self._inner, self.array_form = at + int(pos[0]), 1, True
            return
        buf = self._tail + bytes(a)
        shift = len(self._tail)
        for c in np.flatnonzero((ch == _COLON) & (before == 1)):
            # (read in place: a copy of what comes before each colon was quadratic in a head of
            # many short keys, a damaged file's hang)
            end = _blank_before(buf, shift + int(pos[c]))
            if not buf.endswith(_KEY, 0, end):
                continue
            k = _blank_before(buf, end - len(_KEY))
            if not k or buf[k - 1] not in b"{,":
                continue
            if c + 1 >= pos.size:
                self._want_array = True
                return
            if ch[c + 1] != _OPEN:
                raise NotSliceable  # traceEvents holds no array
            self.open_at, self._inner = at + int(pos[c + 1]), 2
            return


def _blank_before(buf: bytes, end: int) -> int:
    """``end`` moved back over the blanks before it in ``buf``."""
    while end and buf[end - 1] in _BLANK:
        end -= 1
    return end


def boundaries(chunks, slice_bytes: int) -> tuple[int, list[tuple[int, int]], int, bool, int]:
    """The events array of a document read as ``chunks`` (bytes-like, in order) cut into
    slices of about ``slice_bytes``: the offset of its ``[``, each slice as the offsets of
    the separators around it (the ``[`` or a comma, a comma or the ``]``), the offset of the
    ``]``, whether the document is the array itself (the Chrome "JSON array" form), and the
    offset of the array's last comma (-1: none; the caller tells a comma right before the
    ``]`` from the bytes). Raises NotSliceable where there is no such array. Holds a slice's
    cuts, not every comma."""
    scan = _Structure()
    at, begin, ranges = 0, None, []
    for chunk in chunks:
        seps = scan.feed(chunk, at)
        if begin is None and scan.open_at is not None:
            begin = scan.open_at
        while seps.size:
            j = int(np.searchsorted(seps, begin + slice_bytes))
            if j >= seps.size:
                break
            cut = int(seps[j])
            ranges.append((begin, cut))
            begin, seps = cut, seps[j + 1 :]
        at += len(chunk)
    scan.end()
    ranges.append((begin, scan.close_at))
    return scan.open_at, ranges, scan.close_at, scan.array_form, scan.last_sep
