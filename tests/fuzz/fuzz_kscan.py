"""Coverage-guided fuzzer of the Kineto slice decoder (``_kscan.c``), built with ASan, UBSan and
libFuzzer's counters (``native.py``): each input is a slice as the reader hands it over (a
JSON array of events); the decoder returns its tables or a reason, never more. Run through
``run.py``, which preloads the runtime: ``python tests/fuzz/run.py kscan --seconds 60``."""

from __future__ import annotations

import sys

import atheris

from native import load

kscan = load("kscan", sys.argv[1])
from proflab.readers import _kineto_native as kn  # noqa: E402  (takes the instrumented module)
from proflab.readers import _slices  # noqa: E402  (the structure scan takes it too)

CATEGORIES = kn._categories()


def structure(data: bytes) -> None:
    """The compiled structure scan against numpy's, on the input as a document's reads: the
    first byte's value picks where the events array opens (its depth and offset), the second
    how long each read is; every read's commas and state must be numpy's."""
    if len(data) < 3:
        return
    inner, read, data = 1 + data[0] % 3, 1 + data[1] % 64, data[2:]
    scans = [_slices._Structure(native=True), _slices._Structure(native=False)]
    for scan in scans:  # (as though the array had just opened at depth `inner`)
        scan._started = True
        scan.open_at, scan._inner, scan.depth = -1, inner, inner
    at = 0
    for i in range(0, len(data), read):
        got = []
        for scan in scans:
            try:
                got.append(scan.feed(data[i : i + read], at).tolist())
            except _slices.NotSliceable:
                got.append("not sliceable")
        assert got[0] == got[1], got
        if got[0] == "not sliceable":
            return
        state = [tuple(vars(scan)[k] for k in ("in_string", "backslashes", "depth", "close_at", "last_sep")) for scan in scans]
        assert state[0] == state[1], state
        at += read


def one(data: bytes) -> None:
    structure(data)
    try:
        got = kscan.scan(data, CATEGORIES)
    except MemoryError:  # refused: the reader then decodes the slice the usual way
        return
    if isinstance(got, str):
        return
    count, tables, strings = got
    assert count >= 0 and isinstance(strings, list)
    for t in tables:
        n, cap, width = t.shape()
        assert 0 <= n <= cap and memoryview(t).nbytes == cap * width * 8, (n, cap, width)
    # the wrapper's views of them (strided numpy views of each word, no copy)
    for kind, t in zip((kn._GPU, kn._OP, kn._FRAME, 0), tables):
        for column in kn._columns(kind, t).values():
            assert len(column) == t.shape()[0]


if __name__ == "__main__":
    atheris.Setup([sys.argv[0], *sys.argv[2:]], one)
    atheris.Fuzz()
