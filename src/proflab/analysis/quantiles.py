"""Quantiles of a quantity measured in parts, within a stated relative error.

A trace analysed in consecutive parts (``report.combine``) has exact sums, counts and maxima
over its parts, but a median is not a sum of medians. Each part's values are kept instead as
counts of logarithmic bins (DDSketch's mapping): a value ``v`` with ``|v| >= 1`` falls in bin
``ceil(log|v| / log(gamma)) + 1`` (signed as ``v``; 0 in bin 0), ``gamma = (1 + ALPHA) /
(1 - ALPHA)``, and every value of a bin lies within ``ALPHA`` (relative) of the bin's value.
Parts merge by adding counts, and a quantile read from the merged counts is within ``ALPHA``
of the exact one (linear interpolation between the two values around the rank, as polars'
``median``). A kernel's durations from 1 us to 10 ms take at most ~4,600 bins, whatever
their number, so the counts stay small where the values do not fit the budget.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

__all__ = ["ALPHA", "sketch", "merge", "quantile", "by_key", "empty"]

ALPHA = 0.001  # relative error of a quantile read from the counts (0.1 %)
_GAMMA = (1 + ALPHA) / (1 - ALPHA)
_LOG_GAMMA = math.log(_GAMMA)


def empty(key: pl.DataType = pl.String) -> pl.DataFrame:
    """Counts of no value: columns ``key``, ``bin``, ``n``."""
    return pl.DataFrame(schema={"key": key, "bin": pl.Int32, "n": pl.Int64})


def _bins(values: np.ndarray) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    a = np.abs(v)
    with np.errstate(divide="ignore", invalid="ignore"):
        b = np.ceil(np.log(np.maximum(a, 1.0)) / _LOG_GAMMA) + 1
    return (np.sign(v) * np.where(a >= 1.0, b, 0)).astype(np.int32)


def _value(b: np.ndarray) -> np.ndarray:
    """What each bin stands for: within ALPHA of every value in it (0 for bin 0)."""
    m = np.abs(b).astype(np.float64)
    v = np.where(m > 0, 2 * _GAMMA ** (m - 1) / (_GAMMA + 1), 0.0)
    v = np.where(m == 1, 1.0, v)  # bin 1 holds exactly 1 (ceil(log 1) = 0): no rounding
    return np.sign(b) * v


def sketch(values: pl.Series, keys: pl.Series | None = None) -> pl.DataFrame:
    """The bin counts of ``values`` (nulls and non-finite values left out), per ``keys`` (one
    key, null, without them)."""
    keep = values.is_not_null() & values.cast(pl.Float64).is_finite()
    v = values.filter(keep)
    k = keys.filter(keep) if keys is not None else pl.Series("key", [None] * v.len(), dtype=pl.String)
    if v.len() == 0:
        return empty(k.dtype)
    frame = pl.DataFrame({"key": k, "bin": pl.Series(_bins(v.to_numpy()), dtype=pl.Int32)})
    return frame.group_by("key", "bin").agg(pl.len().cast(pl.Int64).alias("n"))


def merge(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """Counts of several parts' values as one (bins' counts added)."""
    parts = [p for p in parts if p.height]
    if not parts:
        return empty()
    return pl.concat(parts).group_by("key", "bin").agg(pl.col("n").sum()).sort("key", "bin", nulls_last=True)


def quantile(counts: pl.DataFrame, q: float, key=None, *, interpolation: str = "linear") -> float | None:
    """The ``q`` quantile of ``key``'s values (within ALPHA, relative): ``linear`` between the
    two values around rank ``q * (n - 1)`` (polars' ``median``), or ``nearest`` (polars'
    ``quantile`` default). None when there are none."""
    rows = counts.filter(pl.col("key").is_null() if key is None else pl.col("key") == key).sort("bin")
    if rows.height == 0:
        return None
    b, n = rows["bin"].to_numpy(), rows["n"].to_numpy()
    cum = np.cumsum(n)
    h = q * (int(cum[-1]) - 1)
    at = lambda r: float(_value(b[int(np.searchsorted(cum, r, side="right"))]))  # noqa: E731
    if interpolation == "nearest":
        return at(math.floor(h + 0.5))  # (halves up, as polars rounds the rank)
    lo = math.floor(h)
    v = at(lo)
    return v if h == lo else v + (h - lo) * (at(lo + 1) - v)


def by_key(counts: pl.DataFrame, q: float) -> pl.DataFrame:
    """The ``q`` quantile (linear, within ALPHA) of every key's values at once: ``key``,
    ``value``."""
    if counts.height == 0:
        return pl.DataFrame(schema={"key": counts.schema.get("key", pl.String), "value": pl.Float64})
    c = counts.sort("key", "bin").with_columns(
        pl.col("n").cum_sum().over("key").alias("cum"), pl.col("n").sum().over("key").alias("total"))
    h = (q * (pl.col("total") - 1)).first()
    lo = h.floor()
    got = c.group_by("key").agg(
        h.alias("h"),
        pl.col("bin").filter(pl.col("cum") > lo).first().alias("lo_bin"),
        pl.col("bin").filter(pl.col("cum") > (lo + 1).clip(upper_bound=pl.col("total").first() - 1)).first().alias("hi_bin"),
    )
    a, b = _value(got["lo_bin"].to_numpy()), _value(got["hi_bin"].to_numpy())
    frac = got["h"].to_numpy() - np.floor(got["h"].to_numpy())
    return pl.DataFrame({"key": got["key"], "value": a + frac * (b - a)})
