"""DetailedProfiler: a timestamped event log of a program's intermediate states (seed 003).

Each ``record(name, **fields)`` takes the wall-clock time and, with CUDA, the allocated and
reserved GPU memory (after a ``torch.cuda.synchronize()`` unless ``sync=False``, so that the
numbers reflect the work queued so far). Inside ``proflab run`` or ``proflab.profile()`` each
event also goes to the run's ``events.jsonl`` and shows on the trace as a zero-length
``proflab.event:<name>`` range.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["DetailedProfiler"]

_OWN_KEYS = frozenset({"name", "time_ns", "elapsed_s", "gpu_memory_bytes", "gpu_reserved_bytes"})


class DetailedProfiler:
    """An in-memory event log; ``events`` is a list of dicts, ``frame()`` a polars DataFrame.

    Event keys: ``name``, ``time_ns`` (wall clock), ``elapsed_s`` (since the log was made),
    ``gpu_memory_bytes`` and ``gpu_reserved_bytes`` (CUDA only; absent otherwise), and yours.
    A field of yours named like one of these keys is kept under ``field_<key>``
    (``record("layer", name="fc1")`` gives ``name="layer"``, ``field_name="fc1"``).
    """

    def __init__(self, *, sync: bool = True) -> None:
        self.sync = sync
        self.events: list[dict[str, Any]] = []
        self._t0 = time.perf_counter()

    def record(self, name: str, /, **fields: Any) -> dict[str, Any]:
        """Log one event named ``name`` (positional only, so that a field may be called
        ``name`` too: it is kept as ``field_name``, like any field named after a key of the log's)."""
        from proflab.collect.api import record as _record
        from proflab.collect.api import renamed_fields

        fields = renamed_fields(fields, _OWN_KEYS)  # on every machine, so events look alike on all
        torch = sys.modules.get("torch")
        extra: dict[str, Any] = {"elapsed_s": round(time.perf_counter() - self._t0, 9)}
        if torch is not None and torch.cuda.is_available():
            if self.sync:
                torch.cuda.synchronize()
            extra["gpu_memory_bytes"] = torch.cuda.memory_allocated()
            extra["gpu_reserved_bytes"] = torch.cuda.memory_reserved()
        event = _record(name, **extra, **fields)
        self.events.append(event)
        return event

    def dump(self, path: str | Path) -> Path:
        """Write the events as a JSON array (atomically)."""
        from proflab.collect.rundir import write_json

        return write_json(path, self.events)

    def frame(self):
        import polars as pl

        return pl.DataFrame(self.events, infer_schema_length=None)

    def __len__(self) -> int:
        return len(self.events)


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """A run's events.jsonl as a list of dicts (a torn last line from a crash is skipped)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out
