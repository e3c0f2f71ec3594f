"""Where GPU time goes: busy vs idle and the compute / communication / memcpy / memset split.

Busy time is the union of activity on a device (overlapping streams count once). The split
is exclusive, by priority: an instant counts as compute if any non-communication kernel runs,
else communication, else memcpy, else memset. So ``communication_ns`` and ``memcpy_ns`` are
the *exposed* parts, not hidden behind compute, and the five parts add up to the wall time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from proflab.analysis.timeline.intervals import IntervalSet
from proflab.model import Trace

__all__ = ["Breakdown", "PartLevels", "device_sets", "breakdown", "part_levels", "combined_breakdowns", "step_table", "low_stretches"]

PARTS = ("compute", "communication", "memcpy", "memset")


@dataclass(frozen=True)
class Breakdown:
    """Time in ns over a window; ``busy_pct`` is percent of ``wall_ns``."""

    wall_ns: int
    compute_ns: int
    communication_ns: int
    memcpy_ns: int
    memset_ns: int

    @property
    def busy_ns(self) -> int:
        return self.compute_ns + self.communication_ns + self.memcpy_ns + self.memset_ns

    @property
    def idle_ns(self) -> int:
        return max(self.wall_ns - self.busy_ns, 0)

    @property
    def busy_pct(self) -> float:
        return 100.0 * self.busy_ns / self.wall_ns if self.wall_ns else 0.0


def device_sets(trace: Trace) -> dict[int, dict[str, IntervalSet]]:
    """Per device, the cumulative priority unions: compute, +communication, +memcpy, +memset.

    ``sets[d]["memset"]`` is therefore all activity on device d.
    """
    gpu = trace.gpu.select("device", "kind", "is_comm", "start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))
    out: dict[int, dict[str, IntervalSet]] = {}
    for (device,), g in gpu.group_by(["device"], maintain_order=True):
        if device is None:
            continue
        part = (
            pl.when(pl.col("kind") == "kernel")
            .then(pl.when(pl.col("is_comm")).then(pl.lit(1)).otherwise(pl.lit(0)))
            .when(pl.col("kind") == "memcpy")
            .then(pl.lit(2))
            .otherwise(pl.lit(3))
        )
        g = g.with_columns(part.alias("part"))
        sets: dict[str, IntervalSet] = {}
        rows = -1
        for level, name in enumerate(PARTS):
            # a level that adds no activity (no communication kernels, no memsets) is the level
            # below it: one set, not a copy (a million kernels' spans are 16 MiB a copy)
            n = int((g.get_column("part") <= level).sum())
            if n == rows:
                sets[name] = sets[PARTS[level - 1]]
                continue
            rows = n
            sub = g.filter(pl.col("part") <= level)
            sets[name] = IntervalSet.from_spans(sub["start_ns"].to_numpy(), sub["end_ns"].to_numpy())
        out[int(device)] = sets
    return dict(sorted(out.items()))


def breakdown(sets: dict[str, IntervalSet], lo, hi) -> dict[str, np.ndarray]:
    """Exclusive split for windows ``[lo, hi)`` (scalars or arrays), in ns."""
    lo = np.asarray(lo, dtype=np.int64)
    hi = np.asarray(hi, dtype=np.int64)
    cum = {name: sets[name].covered_within(lo, hi) for name in PARTS}
    out = {"wall": hi - lo, "compute": cum["compute"]}
    prev = cum["compute"]
    for name in PARTS[1:]:
        out[name] = cum[name] - prev
        prev = cum[name]
    out["busy"] = prev
    out["idle"] = np.maximum(out["wall"] - prev, 0)
    return out


@dataclass(frozen=True)
class PartLevels:
    """A part of a trace analysed in parts, per device and level of ``device_sets``: the
    time its GPU work covers wherever it ran (ns), its work before the part's span (``head``:
    it may run beside the part before's) and from the next part's first work on (``late``:
    beside the next part's head). The parts' union is their sum less those overlaps
    (:func:`combined_breakdowns`)."""

    total_ns: dict[int, dict[str, int]]
    head: dict[int, dict[str, IntervalSet]]
    late: dict[int, dict[str, IntervalSet]]


def part_levels(sets_by_device: dict[int, dict[str, IntervalSet]], lo: int, next_work, within: tuple[int, int]) -> PartLevels:
    """:class:`PartLevels` of a part analysed from ``lo`` (ns) whose next part's first GPU
    work is ``next_work`` (``TraceMeta.next_part_work``); its time counted ``within`` that
    span (ns)."""
    after = min((w.start_ns for w in next_work), default=None)
    total = {d: {name: int(s.covered_within(*within)) for name, s in sets.items()} for d, sets in sets_by_device.items()}
    head = {d: {name: s.clip(-(2**62), lo) for name, s in sets.items()} for d, sets in sets_by_device.items()}
    late = {} if after is None else {d: {name: s.clip(after, 2**62) for name, s in sets.items()} for d, sets in sets_by_device.items()}
    return PartLevels(total, head, late)


def combined_breakdowns(parts: list[PartLevels], wall_ns: int) -> dict[int, Breakdown]:
    """Each device's breakdown over ``wall_ns`` of a trace analysed in parts: per level, the
    parts' times added, less where one part's late work and the next's head ran at once
    (work of two parts overlaps only there: a part's work ends before the next part's span)."""
    cum: dict[int, dict[str, int]] = {}
    for p in parts:
        for d, levels in p.total_ns.items():
            had = cum.setdefault(d, dict.fromkeys(PARTS, 0))
            for name in PARTS:
                had[name] += levels.get(name, 0)
    for a, b in zip(parts, parts[1:]):
        for d, late in a.late.items():
            for name in PARTS:
                x, y = late.get(name), b.head.get(d, {}).get(name)
                if x is not None and y is not None and len(x) and len(y):
                    cum[d][name] -= x.total_ns + y.total_ns - x.union(y).total_ns
    out = {}
    for d, c in sorted(cum.items()):
        # (work of parts further apart running at once, which only a damaged trace's clock
        # gives, would add past the span: no level covers more than it, nor less than the one below)
        level = 0
        for name in PARTS:
            level = c[name] = min(max(c[name], level), wall_ns)
        out[d] = Breakdown(wall_ns, c["compute"], c["communication"] - c["compute"], c["memcpy"] - c["communication"], c["memset"] - c["memcpy"])
    return out


def window_breakdown(sets: dict[str, IntervalSet], lo: int, hi: int) -> Breakdown:
    b = breakdown(sets, lo, hi)
    return Breakdown(
        wall_ns=int(b["wall"]),
        compute_ns=int(b["compute"]),
        communication_ns=int(b["communication"]),
        memcpy_ns=int(b["memcpy"]),
        memset_ns=int(b["memset"]),
    )


def step_table(
    trace: Trace, sets_by_device: dict[int, dict[str, IntervalSet]], gpu_steps: pl.DataFrame | None = None
) -> pl.DataFrame:
    """One row per (step, device): the step's window and its GPU split, in ns.

    The window is the GPU-side step (``analysis.timeline.steps``: ``side == "gpu"``) where the step's
    work can be tied to its launches, else the host's ProfilerStep range (``side ==
    "host"``); ``cpu_dur_ns`` is the host range's length either way."""
    steps = trace.steps.sort("start_ns")
    schema = {
        "step": pl.Int64,
        "device": pl.Int32,
        "side": pl.String,  # "gpu" or "host"
        "start_ns": pl.Int64,
        "dur_ns": pl.Int64,
        "cpu_dur_ns": pl.Int64,
        **{f"{p}_ns": pl.Int64 for p in (*PARTS, "busy", "idle")},
        "busy_pct": pl.Float64,
    }
    if steps.height == 0:
        return pl.DataFrame(schema=schema)
    host = steps.select("step", "start_ns", (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"))
    frames = []
    devices = list(sets_by_device) or [None]
    for device in devices:
        g = None if gpu_steps is None or device is None else gpu_steps.filter(pl.col("device") == device)
        if g is not None and g.height:
            win = g.select("step", "start_ns", "dur_ns", "cpu_dur_ns", pl.lit("gpu").alias("side"))
        else:
            win = host.with_columns(pl.col("dur_ns").alias("cpu_dur_ns"), pl.lit("host").alias("side"))
        lo = win["start_ns"].to_numpy()
        hi = lo + win["dur_ns"].to_numpy()
        if device is None:
            zeros = np.zeros(win.height, dtype=np.int64)
            parts = {p: zeros for p in (*PARTS, "busy")} | {"idle": hi - lo}
        else:
            parts = breakdown(sets_by_device[device], lo, hi)
        cols = {f"{p}_ns": pl.Series(parts[p], dtype=pl.Int64) for p in (*PARTS, "busy", "idle")}
        frames.append(win.with_columns(pl.lit(device, dtype=pl.Int32).alias("device"), **cols))
    df = pl.concat([f.select(sorted(f.columns)) for f in frames], how="vertical_relaxed")
    return df.with_columns(
        (100.0 * pl.col("busy_ns") / pl.col("dur_ns").clip(lower_bound=1)).alias("busy_pct")
    ).select(list(schema)).cast(schema).sort("device", "step")


def low_stretches(
    busy: IntervalSet, lo: int, hi: int, *, threshold_pct: float = 50.0, buckets: int = 400, min_share: float = 0.02
) -> list[tuple[int, int, float]]:
    """Stretches where the GPU is under ``threshold_pct`` busy: the window cut into about
    ``buckets`` equal buckets (1 ms to 100 ms each), consecutive low buckets merged, stretches
    shorter than ``min_share`` of the window dropped. (start_ns, end_ns, busy %), longest first."""
    span = hi - lo
    if span <= 0:
        return []
    size = int(min(max(span // buckets, 1_000_000), 100_000_000))
    # a window of days (one event on a damaged clock) must not become millions of buckets
    size = max(size, -(-span // (10 * buckets)))
    edges = np.arange(lo, hi, size, dtype=np.int64)
    ends = np.minimum(edges + size, hi)
    low = busy.covered_within(edges, ends) * 100.0 < threshold_pct * (ends - edges)
    out = []
    i = 0
    while i < low.size:  # over buckets (at most 10 x ``buckets``), not events
        if not low[i]:
            i += 1
            continue
        j = i
        while j + 1 < low.size and low[j + 1]:
            j += 1
        s, e = int(edges[i]), int(ends[j])
        if e - s >= min_share * span:
            out.append((s, e, 100.0 * float(busy.covered_within(s, e)) / (e - s)))
        i = j + 1
    return sorted(out, key=lambda t: t[0] - t[1])
