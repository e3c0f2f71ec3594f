"""Cross-rank analyses of a job: collectives matched across ranks, wait skew, overlap, bus
bandwidth, and the per-rank table.

Two phases, so that many ranks can be analysed one task per rank (see ``proflab.job``):
:func:`rank_summary` reduces one rank's trace to a few small tables (its collective calls,
the compute that ran under them, per-step figures); :func:`job_tables` matches the summaries
of all ranks. Nothing here holds more than a rank's collectives at once.

A collective's **wait** on a rank is the part of its call spent before the last rank arrived
(``last arrival - own start``): on a GPU, an NCCL kernel that started early spins until its
peers join, and that time is the late rank's cost, not communication's. The rest of the call
(``end - max(own start, last arrival)``) is the **transfer**. Each part is **exposed** where
no compute of the same rank ran under it.

Exposed transfer is split once more, because the profiler slows the host: where the rank's
GPU had no compute *queued* (the next compute kernel's launch had not returned yet), the
collective ran while the GPU waited for its host anyway (**starved**). Unprofiled, that host
keeps ahead and the same transfer runs under the compute it has queued by then; only exposed
transfer with compute queued behind it (the optimizer waiting on the last gradient buckets,
the next layer waiting on its all-gather) is what the collectives cost the step.

Ranks' clocks are compared as recorded (ranks of one host share a clock). A collective ends
at about the same instant on every rank, so the spread of the end times is reported
(``end_spread_us``): a spread comparable to the skew says the clocks disagree (ranks on
several hosts) and the skew is not to be trusted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from proflab.analysis.timeline.intervals import IntervalSet

__all__ = [
    "RankSummary",
    "JobTables",
    "rank_summary",
    "job_tables",
    "link_reference",
    "CALL_SCHEMA",
    "COLLECTIVE_SCHEMA",
    "RANK_SCHEMA",
    "WAITS_SCHEMA",
    "normalize_collective",
    "bus_factor",
]

CALL_SCHEMA = {
    "group": pl.String,
    "step": pl.Int64,  # -1: the trace has no profiler steps
    "seq": pl.Int64,  # order within (group, step)
    "collective": pl.String,  # normalized: allreduce, allgather, reducescatter, broadcast, ...
    "dtype": pl.String,
    "bytes": pl.Int64,  # the message as nccl-tests counts it; null when the trace does not say
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
}

_DTYPE_BYTES = {
    "float": 4, "double": 8, "half": 2, "bfloat16": 2, "int": 4, "long": 8, "short": 2, "byte": 1, "char": 1,
    "bool": 1, "complexfloat": 8, "complexdouble": 16, "float8_e4m3fn": 1, "float8_e5m2": 1,
}  # fmt: skip
_KNOWN = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce", "sendrecv", "send", "recv", "barrier", "gather", "scatter")
# host-side ranges of a CPU backend's collectives (gloo runs them on its own threads)
_HOST_COLLECTIVE = r"^(?:gloo|mpi|ucc):"
_KERNEL_COLLECTIVE = re.compile(r"(?i)nccl(?:Dev)?Kernel_([A-Za-z]+)")


def normalize_collective(name: str | None) -> str | None:
    """``all_reduce``, ``allreduce_coalesced``, ``_allgather_base``, ``AllReduce`` -> the
    collective's plain name (``allreduce``, ``allgather``, ...)."""
    if not name:
        return None
    s = name.lower().replace("_", "").replace("all2all", "alltoall").replace("reduce_scatter", "reducescatter")
    s = s.replace("tensor", "").replace("base", "")
    for k in _KNOWN:
        if s.startswith(k):
            return k
    return s or None


def bus_factor(collective: str | None, n: int) -> float | None:
    """nccl-tests' bus-bandwidth factor: bus bandwidth = message bytes / time x factor."""
    if n < 1 or collective is None:
        return None
    if collective == "allreduce":
        return 2 * (n - 1) / n
    if collective in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    if collective in ("broadcast", "reduce", "sendrecv", "send", "recv"):
        return 1.0
    return None


# Datasheet GPU-to-GPU link bandwidth per direction (GB/s). The traces do not record the
# topology: the figure assumes the ranks' GPUs are joined by the model's NVLink (SXM) or sit
# on PCIe (PCIe cards), and says so.
_LINKS: list[tuple[tuple[str, ...], str, float]] = [
    (("h100", "pcie"), "PCIe 5.0 x16", 64.0),
    (("h200",), "NVLink 4 (18 links)", 450.0),
    (("h100",), "NVLink 4 (18 links)", 450.0),
    (("gh200",), "NVLink 4 (18 links)", 450.0),
    (("a100", "pcie"), "PCIe 4.0 x16", 32.0),
    (("a100",), "NVLink 3 (12 links)", 300.0),
    (("v100",), "NVLink 2 (6 links)", 150.0),
    (("l40s",), "PCIe 4.0 x16", 32.0),
    (("l4",), "PCIe 4.0 x16", 32.0),
    (("a10",), "PCIe 4.0 x16", 32.0),
    (("t4",), "PCIe 3.0 x16", 16.0),
]


def link_reference(device_name: str | None) -> dict[str, Any] | None:
    """The datasheet link a device's collectives can use at best, per direction."""
    if not device_name:
        return None
    n = device_name.lower()
    for keys, link, gbps in _LINKS:
        if all(k in n for k in keys):
            return {"link": link, "gbps_per_direction": gbps, "source": "datasheet; the trace does not record the topology"}
    return None


@dataclass(frozen=True)
class RankSummary:
    """One rank, reduced to what the cross-rank analyses need (small: its collectives, the
    compute under them, per-step figures). ``report`` is the rank's own report."""

    rank: int
    source: str
    side: str  # "gpu": collectives are NCCL kernels; "host": a CPU backend's ranges; "none"
    calls: pl.DataFrame  # CALL_SCHEMA
    covered_starts: np.ndarray  # compute under the collectives (ns spans, disjoint)
    covered_ends: np.ndarray
    steps: pl.DataFrame  # step, dur_ns, compute_ns, host_only_ns, dataloader_ns
    stats: dict[str, Any]
    report: Any = None
    missing: tuple[str, ...] = field(default_factory=tuple)
    # under the collectives, where the rank's GPU had no compute queued (see _starved)
    starved_starts: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    starved_ends: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    whatif: Any = None  # the rank's what-if model (``analysis.whatif``): the job replays the ranks together


def _step_index(t: np.ndarray, steps: pl.DataFrame) -> np.ndarray:
    """The step each instant falls in (-1 outside every step)."""
    if steps.height == 0 or t.size == 0:
        return np.full(t.shape, -1, dtype=np.int64)
    s = steps.sort("start_ns")
    s0, s1, n = s["start_ns"].to_numpy(), s["end_ns"].to_numpy(), s["step"].to_numpy()
    k = np.searchsorted(s0, t, side="right") - 1
    ok = (k >= 0) & (t < s1[np.maximum(k, 0)])
    return np.where(ok, n[np.maximum(k, 0)], -1)


def _calls_gpu(trace, steps: pl.DataFrame) -> pl.DataFrame:
    k = trace.gpu.filter((pl.col("kind") == "kernel") & pl.col("is_comm")).select(
        "name", "external_id", "start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns")
    )
    meta = trace.comms.unique("external_id", keep="first").select("external_id", "collective", "in_nelems", "out_nelems", "dtype", "group")
    k = k.join(meta, on="external_id", how="left").sort("start_ns")
    from_name = [
        (m.group(1) if (m := _KERNEL_COLLECTIVE.search(n)) else None) for n in k["name"].to_list()
    ]
    k = k.with_columns(pl.Series("kname", from_name, dtype=pl.String))
    return _finish_calls(k, steps)


def _calls_host(trace, steps: pl.DataFrame) -> pl.DataFrame:
    c = (
        trace.cpu.filter((pl.col("cat") == "user_annotation") & pl.col("name").str.contains(_HOST_COLLECTIVE))
        .select(
            pl.col("name").str.replace(_HOST_COLLECTIVE, "").alias("kname"),
            "start_ns",
            (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"),
        )
        .sort("start_ns")
        .with_columns(
            pl.lit(None, pl.String).alias("collective"),
            pl.lit(None, pl.Int64).alias("in_nelems"),
            pl.lit(None, pl.Int64).alias("out_nelems"),
            pl.lit(None, pl.String).alias("dtype"),
            pl.lit(None, pl.String).alias("group"),
        )
    )
    return _finish_calls(c, steps)


def _finish_calls(k: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    if k.height == 0:
        return pl.DataFrame(schema=CALL_SCHEMA)
    coll = [normalize_collective(a) or normalize_collective(b) for a, b in zip(k["collective"].to_list(), k["kname"].to_list())]
    size = [_DTYPE_BYTES.get((d or "").lower()) for d in k["dtype"].to_list()]
    nbytes = []
    for c, s, i, o in zip(coll, size, k["in_nelems"].to_list(), k["out_nelems"].to_list()):
        n = o if c == "allgather" else i
        nbytes.append(None if s is None or n is None else int(n) * s)
    step = _step_index(k["start_ns"].to_numpy(), steps)
    out = pl.DataFrame(
        {
            "group": k["group"].fill_null("default"),
            "step": step,
            "collective": coll,
            "dtype": k["dtype"],
            "bytes": nbytes,
            "start_ns": k["start_ns"],
            "end_ns": k["end_ns"],
        },
        schema_overrides={"step": pl.Int64, "bytes": pl.Int64, "collective": pl.String},
    )
    out = out.with_columns(pl.int_range(pl.len()).over("group", "step").cast(pl.Int64).alias("seq"))
    return out.select(list(CALL_SCHEMA)).cast(CALL_SCHEMA)


def rank_summary(ctx, rank: int, *, report=None) -> RankSummary:
    """Reduce one rank (its analysis ``Context``) to a :class:`RankSummary`. Times in ns."""
    trace = ctx.trace
    missing: list[str] = []
    lo, hi = ctx.window
    host_steps = trace.steps.sort("start_ns")
    comm_kernels = trace.has_gpu and trace.gpu["is_comm"].any()
    main_tids = _step_threads(trace)
    if comm_kernels:
        side = "gpu"
        # the GPU-side steps of the device that ran the collectives
        dev = int(trace.gpu.filter(pl.col("is_comm"))["device"].mode().sort()[0])
        gs = ctx.gpu_steps.filter(pl.col("device") == dev).select("step", "start_ns", "end_ns")
        steps_win = gs if gs.height else host_steps
        calls = _calls_gpu(trace, steps_win)
        compute = ctx.device_sets.get(dev, {}).get("compute", IntervalSet.empty())
        if trace.comms.height == 0:
            missing.append("collective metadata (record_param_comms): bytes and process groups unknown")
    elif trace.cpu.height and trace.cpu["name"].str.contains(_HOST_COLLECTIVE).any():
        side = "host"
        dev = None
        steps_win = host_steps
        calls = _calls_host(trace, steps_win)
        ops = trace.cpu.lazy().filter(
            (pl.col("cat") == "cpu_op") & pl.col("tid").is_in(main_tids) & ~pl.col("name").str.contains(r"^c10d::|record_param_comms")
        ).select("start_ns", "dur_ns").collect()
        # host compute: the loop thread's operators (top-level spans merge in the union)
        compute = IntervalSet.from_spans(ops["start_ns"].to_numpy(), (ops["start_ns"] + ops["dur_ns"]).to_numpy())
        missing.append("message sizes: the CPU backend's collectives carry no record_param_comms metadata in this trace")
    else:
        side, dev, steps_win, calls, compute = "none", None, host_steps, pl.DataFrame(schema=CALL_SCHEMA), IntervalSet.empty()
        missing.append("collectives: the trace holds no NCCL kernels and no CPU-backend collective ranges")
    comm = IntervalSet.from_spans(calls["start_ns"].to_numpy(), calls["end_ns"].to_numpy())
    cov = _intersect(compute, comm)
    starved = _intersect(_starved(trace, ctx.launches, dev, compute), comm) if side == "gpu" else IntervalSet.empty()
    per_step = _per_step(ctx, trace, steps_win, compute, main_tids, comm)
    # idle by cause on the collectives' device (GPU traces), over the window
    idle_by_cause: dict[str, int] | None = None
    if side == "gpu":
        g = ctx.gaps.filter(pl.col("device") == dev).group_by("cause").agg(pl.col("dur_ns").sum())
        idle_by_cause = {str(c): int(v) for c, v in sorted(g.iter_rows(), key=lambda r: (-r[1], str(r[0])))}
    info = ctx.device_info or {}
    stats = {
        "device": dev,
        "device_name": info.get("name"),
        "window_ns": int(hi - lo),
        "steps": per_step.height,
        "step_ns_median": None if per_step.height == 0 else float(per_step["dur_ns"].median()),
        "step_sum_ns": None if per_step.height == 0 else int(per_step["dur_ns"].sum()),
        "compute_ns": compute.clip(lo, hi).total_ns,
        "comm_ns": comm.total_ns,
        "idle_by_cause_ns": idle_by_cause,
        "idle_ns": None if side != "gpu" else int(ctx.device_breakdowns[dev].idle_ns),
        "step_side": "gpu" if side == "gpu" and steps_win is not host_steps else "host",
        "world_size": (trace.meta.distributed or {}).get("world_size"),
        "backend": (trace.meta.distributed or {}).get("backend"),
    }
    return RankSummary(
        rank, trace.meta.source, side, calls, cov.starts, cov.ends, per_step, stats, report, tuple(missing),
        starved.starts, starved.ends, whatif=ctx.whatif if side == "gpu" else None,
    )


def _starved(trace, launches: pl.DataFrame, dev: int, compute: IntervalSet) -> IntervalSet:
    """Where device ``dev`` runs no compute and has none queued: within each gap between its
    compute spans, from the gap's start until the earliest launch (its call returned) of any
    compute kernel that starts after the gap. Compute whose launch is not in the trace counts
    as queued (nothing is called starved that the trace cannot show)."""
    if len(compute) < 2 or launches.height == 0:
        return IntervalSet.empty()
    k = (
        trace.gpu.filter((pl.col("device") == dev) & (pl.col("kind") == "kernel") & ~pl.col("is_comm"))
        .select("start_ns", "correlation")
        .join(launches.select("correlation", "launch_end_ns").unique("correlation"), on="correlation", how="left")
        .sort("start_ns")
    )
    ks = k["start_ns"].to_numpy()
    queued = k["launch_end_ns"].fill_null(np.iinfo(np.int64).min).to_numpy()
    # the earliest launch return among the kernels starting at or after each one
    sufmin = np.minimum.accumulate(queued[::-1])[::-1]
    g0, g1 = compute.ends[:-1], compute.starts[1:]
    nxt = np.searchsorted(ks, g1, side="left")
    ok = nxt < len(ks)
    g0, g1, nxt = g0[ok], g1[ok], nxt[ok]
    until = np.clip(sufmin[nxt], g0, g1)
    return IntervalSet.from_spans(g0, until)


def _step_threads(trace) -> list[int]:
    """The thread(s) that run the loop: those holding ProfilerStep ranges."""
    t = trace.cpu.filter(pl.col("name").str.starts_with("ProfilerStep#"))["tid"].drop_nulls().unique().to_list()
    return t


def _intersect(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    """a ∩ b (both disjoint and sorted)."""
    if len(a) == 0 or len(b) == 0:
        return IntervalSet.empty()
    # pairs whose spans overlap: a sweep over b's spans, each clipped to the a-spans it meets
    i0 = np.searchsorted(a.ends, b.starts, side="right")
    i1 = np.searchsorted(a.starts, b.ends, side="left")
    counts = np.maximum(i1 - i0, 0)
    if counts.sum() == 0:
        return IntervalSet.empty()
    bi = np.repeat(np.arange(len(b)), counts)
    ai = np.concatenate([np.arange(x, y) for x, y in zip(i0, i1) if y > x])
    s = np.maximum(a.starts[ai], b.starts[bi])
    e = np.minimum(a.ends[ai], b.ends[bi])
    return IntervalSet.from_spans(s, e)


def _difference(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    """a minus b (both disjoint and sorted)."""
    inter = _intersect(a, b)
    if len(inter) == 0:
        return a
    t = np.concatenate([a.starts, a.ends, inter.starts, inter.ends])
    d = np.concatenate([np.ones(len(a), np.int64), -np.ones(len(a), np.int64), -np.ones(len(inter), np.int64), np.ones(len(inter), np.int64)])
    order = np.lexsort((d, t))
    t, level = t[order], np.cumsum(d[order])
    on = level[:-1] == 1
    return IntervalSet.from_spans(t[:-1][on], t[1:][on])


def _per_step(ctx, trace, steps_win: pl.DataFrame, compute: IntervalSet, main_tids: list[int], comm: IntervalSet) -> pl.DataFrame:
    """Per step: its duration, the compute in it, and the loop thread's host work that
    launches nothing (sleep, I/O, the program's own Python) and its DataLoader time. Host
    time while the rank's own collectives run is left out: a loop thread blocked on a
    collective (gloo's wait at the end of backward) is waiting, not working."""
    schema = {"step": pl.Int64, "dur_ns": pl.Int64, "compute_ns": pl.Int64, "host_only_ns": pl.Int64, "dataloader_ns": pl.Int64}
    if steps_win.height == 0:
        return pl.DataFrame(schema=schema)
    s = steps_win.sort("start_ns")
    a, b = s["start_ns"].to_numpy(), s["end_ns"].to_numpy()
    comp = compute.covered_within(a, b)
    host = trace.steps.sort("start_ns")
    ha, hb = host["start_ns"].to_numpy(), host["end_ns"].to_numpy()
    spans = ctx.host_only.filter(pl.col("tid").is_in(main_tids) & ~pl.col("name").str.contains(_HOST_COLLECTIVE))
    quiet = _difference(IntervalSet.from_spans(spans["start_ns"].to_numpy(), spans["end_ns"].to_numpy()), comm)
    dl = trace.cpu.filter(pl.col("name").str.contains(r"(?i)dataloader.*__next__|enumerate\(DataLoader\)"))
    dls = IntervalSet.from_spans(dl["start_ns"].to_numpy(), (dl["start_ns"] + dl["dur_ns"]).to_numpy())
    hstep = dict(zip(host["step"].to_list(), zip(ha.tolist(), hb.tolist())))
    h0 = np.array([hstep.get(k, (0, 0))[0] for k in s["step"].to_list()], dtype=np.int64)
    h1 = np.array([hstep.get(k, (0, 0))[1] for k in s["step"].to_list()], dtype=np.int64)
    return pl.DataFrame(
        {
            "step": s["step"],
            "dur_ns": b - a,
            "compute_ns": comp,
            "host_only_ns": quiet.covered_within(h0, h1),
            "dataloader_ns": dls.covered_within(h0, h1),
        },
        schema=schema,
    )


# -- the cross-rank phase -----------------------------------------------------------------


@dataclass(frozen=True)
class JobTables:
    """The cross-rank tables of a job (polars; ns inside, ms in the report).

    ``collectives``: one row per matched collective (group, step, seq) with the ranks'
    arrival spread. ``waits``: one row per (collective, rank): start, end, wait, transfer and
    their exposed parts. ``ranks``: one row per rank."""

    ranks: pl.DataFrame
    collectives: pl.DataFrame
    waits: pl.DataFrame
    notes: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()


def job_tables(summaries: list[RankSummary]) -> JobTables:
    notes: list[str] = []
    missing = sorted({m for s in summaries for m in s.missing})
    n = len(summaries)
    calls = [s.calls.with_columns(pl.lit(s.rank, pl.Int64).alias("rank")) for s in summaries if s.calls.height]
    waits = _match(calls, n, notes) if len(calls) == n and n >= 2 else None
    if waits is None or waits.height == 0:
        if n >= 2 and len(calls) < n:
            notes.append("some ranks hold no collectives: nothing to match across ranks")
        waits = pl.DataFrame(schema=_WAIT_SCHEMA)
    # exposed parts: each rank's wait and transfer spans minus its own compute under them
    parts = []
    for s in summaries:
        w = waits.filter(pl.col("rank") == s.rank)
        if w.height == 0:
            zero = [pl.lit(0, pl.Int64).alias(c) for c in ("exposed_wait_ns", "exposed_transfer_ns", "starved_transfer_ns")]
            parts.append(w.with_columns(*zero))
            continue
        cov = IntervalSet(s.covered_starts, s.covered_ends)
        starved = IntervalSet(s.starved_starts, s.starved_ends)
        st, mid, en = w["start_ns"].to_numpy(), w["transfer_start_ns"].to_numpy(), w["end_ns"].to_numpy()
        parts.append(
            w.with_columns(
                pl.Series("exposed_wait_ns", (mid - st) - cov.covered_within(st, mid), dtype=pl.Int64),
                pl.Series("exposed_transfer_ns", (en - mid) - cov.covered_within(mid, en), dtype=pl.Int64),
                pl.Series("starved_transfer_ns", starved.covered_within(mid, en), dtype=pl.Int64),
            )
        )
    waits = pl.concat(parts) if parts else pl.DataFrame(schema=WAITS_SCHEMA)
    n_ranks = n
    colls = _collectives(waits, n_ranks)
    ranks = _rank_table(summaries, waits)
    return JobTables(ranks=ranks, collectives=colls, waits=waits, notes=tuple(notes), missing=tuple(missing))


_WAIT_SCHEMA = {
    "group": pl.String, "step": pl.Int64, "seq": pl.Int64, "collective": pl.String, "bytes": pl.Int64,
    "rank": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64, "last_arrival_ns": pl.Int64, "last_rank": pl.Int64,
    "transfer_start_ns": pl.Int64, "wait_ns": pl.Int64, "transfer_ns": pl.Int64,
}  # fmt: skip
WAITS_SCHEMA = {**_WAIT_SCHEMA, "exposed_wait_ns": pl.Int64, "exposed_transfer_ns": pl.Int64, "starved_transfer_ns": pl.Int64}


def _match(calls: list[pl.DataFrame], n: int, notes: list[str]) -> pl.DataFrame:
    """Rows of every rank's calls that match by (group, step, seq) across all ranks and agree
    on the collective (and its bytes, where known)."""
    allc = pl.concat(calls)
    key = ["group", "step", "seq"]
    # only steps every rank recorded (windows may differ by a step at the edges)
    per = allc.group_by(key).agg(
        pl.len().alias("n"),
        pl.col("collective").n_unique().alias("kinds"),
        pl.col("bytes").drop_nulls().n_unique().alias("sizes"),
    )
    full = per.filter(pl.col("n") == n)
    bad = full.filter((pl.col("kinds") > 1) | (pl.col("sizes") > 1))
    if bad.height:
        notes.append(
            f"{bad.height} collective(s) differ between ranks at the same position (collective or message size): "
            "left out of the matching (a rank issued collectives in another order)"
        )
    unmatched = per.height - full.height
    if unmatched:
        notes.append(f"{unmatched} collective position(s) are not on every rank (steps outside some rank's window): left out")
    good = full.filter((pl.col("kinds") == 1) & (pl.col("sizes") <= 1)).select(key)
    m = allc.join(good, on=key, how="inner")
    if m.height == 0:
        return pl.DataFrame(schema=_WAIT_SCHEMA)
    last = m.group_by(key).agg(
        pl.col("start_ns").max().alias("last_arrival_ns"),
        pl.col("rank").sort_by("start_ns").last().alias("last_rank"),
        pl.col("bytes").drop_nulls().first().alias("bytes_any"),
    )
    m = m.join(last, on=key).with_columns(pl.col("bytes").fill_null(pl.col("bytes_any")))
    m = m.with_columns(pl.min_horizontal(pl.max_horizontal("start_ns", "last_arrival_ns"), "end_ns").alias("transfer_start_ns"))
    m = m.with_columns(
        (pl.col("transfer_start_ns") - pl.col("start_ns")).alias("wait_ns"),
        (pl.col("end_ns") - pl.col("transfer_start_ns")).alias("transfer_ns"),
    )
    return m.select(list(_WAIT_SCHEMA)).cast(_WAIT_SCHEMA).sort("group", "step", "seq", "rank")


COLLECTIVE_SCHEMA = {
    "group": pl.String, "step": pl.Int64, "seq": pl.Int64, "collective": pl.String, "bytes": pl.Int64,
    "first_arrival_ns": pl.Int64, "last_arrival_ns": pl.Int64, "last_rank": pl.Int64, "skew_ns": pl.Int64,
    "second_last_arrival_ns": pl.Int64, "transfer_ns": pl.Int64, "end_spread_ns": pl.Int64, "busbw_gbps": pl.Float64,
}  # fmt: skip
# the per-rank table's fixed columns (ms, %); idle_<cause>_ms columns follow for GPU ranks
RANK_SCHEMA = {
    "rank": pl.Int64, "side": pl.String, "device_name": pl.String, "steps": pl.Int64, "step_ms": pl.Float64,
    "step_side": pl.String, "bare_step_ms": pl.Float64, "bare_clock": pl.String, "profiled_step_ms": pl.Float64, "window_ms": pl.Float64,
    "compute_ms": pl.Float64, "comm_ms": pl.Float64, "comm_matched_ms": pl.Float64, "wait_ms": pl.Float64,
    "transfer_ms": pl.Float64, "exposed_wait_ms": pl.Float64, "exposed_transfer_ms": pl.Float64,
    "starved_transfer_ms": pl.Float64, "overlap_pct": pl.Float64, "idle_ms": pl.Float64, "host_only_ms": pl.Float64, "dataloader_ms": pl.Float64,
    "collectives": pl.Int64, "late_ms": pl.Float64,
}  # fmt: skip


def _collectives(waits: pl.DataFrame, n: int) -> pl.DataFrame:
    schema = COLLECTIVE_SCHEMA
    if waits.height == 0:
        return pl.DataFrame(schema=schema)
    key = ["group", "step", "seq"]
    c = waits.group_by(key).agg(
        pl.col("collective").first(),
        pl.col("bytes").first(),
        pl.col("start_ns").min().alias("first_arrival_ns"),
        pl.col("last_arrival_ns").first(),
        pl.col("last_rank").first(),
        # the arrival before the last one: how much later the latest rank came than the next
        pl.col("start_ns").sort().reverse().get(1).alias("second_last_arrival_ns"),
        pl.col("transfer_ns").median().cast(pl.Int64).alias("transfer_ns"),
        (pl.col("end_ns").max() - pl.col("end_ns").min()).alias("end_spread_ns"),
    )
    factor = pl.col("collective").map_elements(lambda x: bus_factor(x, n), return_dtype=pl.Float64)
    c = c.with_columns(
        (pl.col("last_arrival_ns") - pl.col("first_arrival_ns")).alias("skew_ns"),
        pl.when(pl.col("transfer_ns") > 0).then(pl.col("bytes").cast(pl.Float64) / pl.col("transfer_ns") * factor).alias("busbw_gbps"),
    )
    return c.select(list(schema)).cast(schema).sort(key)


def late_ns(waits: pl.DataFrame, rank: int) -> int:
    """How much later than every other rank ``rank`` arrived, per step the largest such
    lead over the step's collectives, summed over steps. A delay carries over to the step's
    later collectives, so summing every collective would count it again."""
    if waits.height == 0:
        return 0
    per = (
        waits.group_by("group", "step", "seq")
        .agg(
            pl.col("last_rank").first(),
            (pl.col("start_ns").max() - pl.col("start_ns").sort().reverse().get(1)).alias("lead_ns"),
        )
        .filter(pl.col("last_rank") == rank)
    )
    if per.height == 0:
        return 0
    return int(per.group_by("step").agg(pl.col("lead_ns").max())["lead_ns"].sum())


def _rank_table(summaries: list[RankSummary], waits: pl.DataFrame) -> pl.DataFrame:
    rows = []
    for s in summaries:
        w = waits.filter(pl.col("rank") == s.rank)
        st = s.stats
        comm = int(st["comm_ns"])
        # unions, not sums: a CPU backend runs collectives on several threads at once
        cov = IntervalSet(s.covered_starts, s.covered_ends)
        ws = IntervalSet.from_spans(w["start_ns"].to_numpy(), w["transfer_start_ns"].to_numpy())
        ts = _difference(IntervalSet.from_spans(w["transfer_start_ns"].to_numpy(), w["end_ns"].to_numpy()), ws)
        wait, transfer = ws.total_ns, ts.total_ns
        ew = wait - _intersect(ws, cov).total_ns
        et = transfer - _intersect(ts, cov).total_ns
        starved = _intersect(ts, IntervalSet(s.starved_starts, s.starved_ends)).total_ns
        hidden = cov.total_ns
        steps = s.steps
        rows.append(
            {
                "rank": s.rank,
                "side": s.side,
                "device_name": st.get("device_name"),
                "steps": st["steps"],
                "step_ms": None if st["step_ns_median"] is None else st["step_ns_median"] / 1e6,
                # "gpu": step_ms is the GPU-side step (first kernel to last); "host": the loop's
                "step_side": st.get("step_side"),
                # measured by `proflab run` in the rank's own process (processes/<pid>.json):
                # the loop's median step without the profiler, and while it recorded
                "bare_step_ms": st.get("bare_step_ms"),
                "bare_clock": st.get("bare_clock"),  # "gpu" (CUDA events) or "host"
                "profiled_step_ms": st.get("profiled_step_ms"),
                "window_ms": st["window_ns"] / 1e6,
                "compute_ms": st["compute_ns"] / 1e6,
                "comm_ms": comm / 1e6,
                "comm_matched_ms": (wait + transfer) / 1e6,
                "wait_ms": wait / 1e6,
                "transfer_ms": transfer / 1e6,
                "exposed_wait_ms": ew / 1e6,
                "exposed_transfer_ms": et / 1e6,
                # of it, while the rank's GPU had no compute queued (its host was behind)
                "starved_transfer_ms": starved / 1e6,
                "overlap_pct": None if comm == 0 else 100.0 * hidden / comm,
                "idle_ms": None if st.get("idle_ns") is None else st["idle_ns"] / 1e6,
                "host_only_ms": float(steps["host_only_ns"].sum()) / 1e6 if steps.height else None,
                "dataloader_ms": float(steps["dataloader_ns"].sum()) / 1e6 if steps.height else None,
                "collectives": s.calls.height,
                "late_ms": late_ns(waits, s.rank) / 1e6,
                **{f"idle_{c}_ms": v / 1e6 for c, v in (st.get("idle_by_cause_ns") or {}).items()},
            }
        )
    if not rows:
        return pl.DataFrame(schema=RANK_SCHEMA)
    return pl.DataFrame(rows, schema_overrides=RANK_SCHEMA, infer_schema_length=None)
