"""What ``proflab run`` records unless told otherwise: read by :class:`launcher.RunOptions`
and by the command line's options, without importing the launcher (its imports, the
subprocess and run-directory machinery, cost every other command 20-30 ms, ``--help`` too)."""

from __future__ import annotations

__all__ = ["RECORD_SHAPES", "WITH_STACK"]

# Off: no analysis reads input shapes, and recording them adds to the profiler's cost
# (measured on realistic H100 loops: tests/data/realistic/README.md).
RECORD_SHAPES = False
WITH_STACK = False
