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

CATEGORIES = kn._categories()


def one(data: bytes) -> None:
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
