"""The model of an Nsight Compute result: profiled launches, their metrics and ncu's rules.

A profile holds a few to a few hundred launches, each with up to a few thousand metrics, so
the tables are small; they are still polars tables so that SQL, JSON and the renderers see
the same shape as the timeline model. Values are converted to base units when read: time in
ns, sizes in bytes, rates per second, frequencies in Hz, percentages in %.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import polars as pl

__all__ = ["NcuProfile", "LAUNCH_SCHEMA", "METRIC_SCHEMA", "RULE_SCHEMA"]

LAUNCH_SCHEMA = {
    "launch_id": pl.Int64,
    "name": pl.String,  # as ncu printed it (function, demangled or mangled base)
    "pid": pl.Int64,
    "device": pl.Int64,
    "cc": pl.String,  # compute capability, e.g. "9.0"
    "stream": pl.Int64,
    "grid": pl.String,  # "(x, y, z)"
    "block": pl.String,
}
METRIC_SCHEMA = {
    "launch_id": pl.Int64,
    "metric": pl.String,  # ncu metric name (raw page) or a canonical name (details page)
    "value": pl.Float64,  # in base units; null for text values
    "unit": pl.String,  # base unit after conversion: ns, byte, byte/s, hz, %, ...
    "text": pl.String,  # the value as ncu printed it
}
RULE_SCHEMA = {
    "launch_id": pl.Int64,
    "section": pl.String,
    "rule": pl.String,
    "type": pl.String,  # OPT (optimisation), INF, WRN, ERR
    "description": pl.String,
    "speedup_type": pl.String,  # local (the kernel's own part) or global (the whole kernel)
    "est_speedup_pct": pl.Float64,  # ncu's estimate of the kernel-time reduction, %
}


@dataclass(frozen=True)
class NcuProfile:
    """One Nsight Compute result. ``kind`` is ``raw`` (``--page raw``: every metric by its
    ncu name), ``details`` (``--page details``: section display names, mapped to ncu names
    where proflab knows them, plus ncu's rule results) or ``ncu-rep``."""

    path: str
    kind: str
    launches: pl.DataFrame
    metrics: pl.DataFrame
    rules: pl.DataFrame
    ncu_version: str | None = None
    notes: tuple[str, ...] = field(default=())

    @cached_property
    def _values(self) -> dict[int, dict[str, tuple[float | None, str, str]]]:
        out: dict[int, dict[str, tuple[float | None, str, str]]] = {}
        for lid, metric, value, unit, text in self.metrics.iter_rows():
            out.setdefault(lid, {})[metric] = (value, unit, text)
        return out

    def metric_names(self, launch_id: int) -> frozenset[str]:
        return frozenset(self._values.get(launch_id, {}))

    def value(self, launch_id: int, *names: str) -> float | None:
        """The first of ``names`` this launch has a numeric value for (ncu renamed metrics
        between versions; callers list the names newest first)."""
        vals = self._values.get(launch_id, {})
        for n in names:
            v = vals.get(n)
            if v is not None and v[0] is not None:
                return v[0]
        return None

    def text(self, launch_id: int, name: str) -> str | None:
        v = self._values.get(launch_id, {}).get(name)
        return None if v is None else v[2]

    def rules_for(self, launch_id: int) -> list[dict[str, Any]]:
        return self.rules.filter(pl.col("launch_id") == launch_id).to_dicts()

    @property
    def launch_ids(self) -> list[int]:
        return self.launches["launch_id"].to_list()
