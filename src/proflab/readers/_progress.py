"""Progress of a long read, for whoever shows it (the CLI on a terminal; nobody otherwise).

Readers call :func:`update` as they go; it does nothing unless a sink was installed with
:func:`reporting`, so the library and pipes stay quiet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["reporting", "update"]

Sink = Callable[[float | None], None]  # fraction done (0..1), None when unknown
_sink: Sink | None = None


@contextmanager
def reporting(sink: Sink) -> Iterator[None]:
    global _sink
    before, _sink = _sink, sink
    try:
        yield
    finally:
        _sink = before


def update(fraction: float | None) -> None:
    if _sink is not None:
        _sink(None if fraction is None else min(max(fraction, 0.0), 1.0))
