"""Memory copies: direction, pageable vs pinned, bytes and achieved bandwidth.

The reference bandwidth for host<->device copies is the best pinned copy of the same
direction measured in this trace when there is one (>= 1 MiB), else a practical PCIe figure
for the device's generation — which is then marked as a reference, not a measurement.
"""

from __future__ import annotations

import polars as pl

from proflab.model import Trace

__all__ = ["copies", "has_copies", "memcpy_table", "reference_link", "pageable_host_copies", "pinning_savings", "combined_memcpy_table"]

_MIN_MEASURE_BYTES = 1 << 20

# Practical pinned host<->device bandwidth per x16 link (GB/s), by PCIe generation.
_PCIE_PRACTICAL_GBPS = {3: 12.0, 4: 25.0, 5: 50.0}


def reference_link(compute_major: int | None) -> tuple[str, float]:
    """(description, practical GB/s) of the host link a device of this generation sits on."""
    if compute_major is None:
        return "PCIe Gen4 x16 (assumed: device generation unknown)", _PCIE_PRACTICAL_GBPS[4]
    gen = 5 if compute_major >= 9 else 4 if compute_major >= 8 else 3
    return f"PCIe Gen{gen} x16 (practical pinned rate)", _PCIE_PRACTICAL_GBPS[gen]


def copies(trace: Trace, *columns: str) -> pl.DataFrame:
    """The memcpy rows, with only these columns. (``Trace.memcpy`` copies every GPU column:
    on the 1 GB export 463 k copies, ~45 MiB each time a rule read them.)"""
    return trace.gpu.lazy().filter(pl.col("kind") == "memcpy").select(columns).collect()


def has_copies(trace: Trace) -> bool:
    """Whether the trace holds any memcpy, tested on the kind column alone."""
    return bool(trace.gpu.get_column("kind").eq("memcpy").any())


def memcpy_table(trace: Trace) -> pl.DataFrame:
    """Copies grouped by direction and memory kinds: count, bytes, time (ns), GB/s."""
    m = copies(trace, "copy_kind", "src_kind", "dst_kind", "bytes", "dur_ns")
    if m.height == 0:
        return pl.DataFrame()
    return (
        m.group_by("copy_kind", "src_kind", "dst_kind")
        .agg(
            pl.len().alias("count"),
            pl.col("bytes").sum().alias("bytes"),
            pl.col("dur_ns").sum().alias("time_ns"),
            pl.col("bytes").is_null().any().alias("bytes_missing"),
        )
        .with_columns(
            (pl.col("bytes") / pl.col("time_ns").clip(lower_bound=1)).alias("gbps"),  # bytes/ns == GB/s
            ((pl.col("src_kind") == "Pageable") | (pl.col("dst_kind") == "Pageable")).alias("pageable"),
        )
        # (ties by the kinds: groups come in no fixed order, and two of equal time swapped places
        # between runs of the same trace, tests/data/gains/lm_sync.base)
        .sort("time_ns", "copy_kind", "src_kind", "dst_kind", descending=[True, False, False, False], nulls_last=True)
    )


def best_pinned_gbps(trace: Trace, copy_kind: str) -> float | None:
    """Highest measured rate (GB/s) of a pinned copy of this direction of at least 1 MiB."""
    m = copies(trace, "copy_kind", "src_kind", "dst_kind", "bytes", "dur_ns").filter(
        (pl.col("copy_kind") == copy_kind)
        & (pl.col("bytes") >= _MIN_MEASURE_BYTES)
        & ((pl.col("src_kind") == "Pinned") | (pl.col("dst_kind") == "Pinned"))
        & (pl.col("dur_ns") > 0)
    )
    if m.height == 0:
        return None
    return float((m["bytes"] / m["dur_ns"]).max())


_HOST_DIRECTIONS = ("HtoD", "DtoH")


def pageable_host_copies(trace: Trace) -> pl.DataFrame:
    """Host<->device copies whose host side is pageable memory (direction, memory kinds,
    bytes, time, correlation)."""
    return copies(trace, "copy_kind", "src_kind", "dst_kind", "bytes", "dur_ns", "correlation").filter(
        pl.col("copy_kind").is_in(_HOST_DIRECTIONS)
        & ((pl.col("src_kind") == "Pageable") | (pl.col("dst_kind") == "Pageable"))
    )


def pinning_savings(trace: Trace, compute_major: int | None) -> tuple[int, list[dict], bool]:
    """Copy time (ns) pinning would save, per-direction evidence rows, and whether some
    direction had no byte counts (then it is left out, not guessed)."""
    saved, rows, unsized = 0, [], False
    for (direction,), g in pageable_host_copies(trace).group_by(["copy_kind"], maintain_order=True):
        known = g.drop_nulls("bytes")
        if known.height == 0:
            unsized = True
            continue
        measured = best_pinned_gbps(trace, str(direction))
        if measured:
            ref_gbps, ref_src = measured, f"best pinned {direction} copy measured in this trace"
        else:
            desc, ref_gbps = reference_link(compute_major)
            ref_src = f"reference, not measured: {desc}"
        ideal = (known["bytes"] / ref_gbps).cast(pl.Int64)  # bytes / (GB/s) == ns
        s = int((known["dur_ns"] - ideal).clip(lower_bound=0).sum())
        saved += s
        t = int(known["dur_ns"].sum())
        rows.append(
            {
                "direction": str(direction),
                "copies": g.height,
                "bytes": int(known["bytes"].sum()),
                "time_ms": round(t / 1e6, 3),
                "achieved_gbps": round(float(known["bytes"].sum()) / max(t, 1), 2),
                "reference_gbps": round(ref_gbps, 2),
                "reference": ref_src,
                "saving_ms": round(s / 1e6, 3),
            }
        )
    return saved, rows, unsized


def combined_memcpy_table(tables: list[pl.DataFrame]) -> pl.DataFrame:
    """:func:`memcpy_table` of a trace analysed in parts, from each part's: exact."""
    tables = [t.with_columns(pl.col("copy_kind", "src_kind", "dst_kind").cast(pl.String)) for t in tables if t.height]
    if not tables:
        return pl.DataFrame()
    return (
        pl.concat(tables, how="vertical_relaxed")
        .group_by("copy_kind", "src_kind", "dst_kind", maintain_order=True)
        .agg(pl.col("count").sum(), pl.col("bytes").sum(), pl.col("time_ns").sum(), pl.col("bytes_missing").any(),
             pl.col("pageable").first())
        .with_columns((pl.col("bytes") / pl.col("time_ns").clip(lower_bound=1)).alias("gbps"))
        .sort("time_ns", descending=True, maintain_order=True)
    )
