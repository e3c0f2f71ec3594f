"""The host's runtime and driver calls (CUDA, HIP) picked by name.

A pattern is tested once per distinct call name, then the rows are kept by a lookup of their
name: a regular expression on every host row cost 0.2 s a filter on an Nsight Systems export
of 11.5 M host rows (2.97 M calls of 10 names), the distinct names and the lookup
72-96 ms.
"""

from __future__ import annotations

import weakref

import polars as pl

__all__ = ["IS_CALL", "call_names"]

# a host row that is a runtime or driver call
IS_CALL = pl.col("cat").is_in(["cuda_runtime", "cuda_driver"])


def call_names(cpu: pl.DataFrame, pattern: str) -> pl.Series:
    """The distinct names of ``cpu``'s runtime and driver calls that ``pattern`` matches (a
    regular expression, searched as ``str.contains`` does): ``IS_CALL &
    pl.col("name").is_in(call_names(cpu, p).implode())`` keeps the rows
    ``IS_CALL & pl.col("name").str.contains(p)`` keeps."""
    names = _distinct(cpu)
    return names.filter(names.str.contains(pattern))


# the distinct call names of each host table alive (id -> (a weak reference to it, its names)):
# the analysis asks for them four times, 58 ms each on that export
_DISTINCT: dict[int, tuple[weakref.ref, pl.Series]] = {}


def _distinct(cpu: pl.DataFrame) -> pl.Series:
    key = id(cpu)
    got = _DISTINCT.get(key)
    if got is not None and got[0]() is cpu:
        return got[1]
    names = cpu.select(pl.col("name").filter(IS_CALL).unique()).to_series()
    _DISTINCT[key] = (weakref.ref(cpu, lambda _, key=key: _DISTINCT.pop(key, None)), names)
    return names
