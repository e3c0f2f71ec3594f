"""The profiler's own cost, and what the loop would do without it.

torch.profiler slows the host: every recorded operator, runtime call and Python frame costs
microseconds, and a loop that keeps its GPU busy when not profiled can look host-bound in its
trace (measured on an H100 with PyTorch 2.11: 1.0-2.6x GPU-side step time, see
``benchmarks/bench_profiler_cost.py``). A host- or launch-bound verdict must survive that.

The model, per step (medians over the trace's GPU-side steps):

``gpu_work``   the GPU's busy time per step (union of kernels, copies, memsets);
``host_work``  the host's time per step that was not spent blocked (in syncs, in blocking
               copies, or in launch calls waiting on a full queue);
``cost``       what the profiler added to ``host_work``: recorded host events per step times a
               per-event cost. Calibrated on eight realistic loops (transformer LMs eager and
               compiled, a CUDA-graphed MLP, a per-parameter optimizer, a DataLoader-fed CNN,
               fp32, large copies) against their unprofiled host time: 2.3-8.2 us per
               operator / runtime event and 2.8-4.9 us per Python frame (``with_stack``). A
               later recording of the DataLoader-fed CNN (8.5 k frames of small Python
               functions per step, tests/data/realistic/rerun) cost 0.2-1.0 us per frame: its
               profiled step was 39.9 ms against 38.3 ms bare before the profiled windows and
               31.6 ms after. The range below is wider than all of that on both ends. For a
               generation loop the trace's own per-event cost (``event_cost``: the gaps
               the profiler's callbacks leave between nested operators) replaces the
               operators' range: this host, this PyTorch, these options (``record_shapes``);
``unprofiled host`` ``host_work - cost``, never below what an unprofiled eager step costs at
               least (about 1 us of dispatch per operator and 2.5 us per launch).

The profiler's cost scales with the events it records, so it is bounded where they are: time
in work that launches nothing (``host_only_spans``: a DataLoader's ``__next__``, a stretch
outside any operator) gives back at most the cost of the events recorded inside it, and
the rest of the step the cost of its own. A 27 ms ``__next__`` recording 44 events is 27 ms
of real work at any per-event cost; a subtraction over the whole step could take it for the
profiler's where the step records many events elsewhere.

The host leaves the GPU idle per step by ``max(0, unprofiled host - gpu_work)``; a finding
about host or launch overhead states that excess at the *conservative* end (the largest
plausible profiler cost), so it survives the correction. A measured unprofiled step time
(``proflab run`` times steps outside its window; ``analyze --bare-step-ms`` takes one) replaces
the estimate: the excess is then ``bare step - gpu_work``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import polars as pl

from proflab.analysis.timeline.intervals import IntervalSet
from proflab.analysis.timeline.threads import ThreadClock
from proflab.model import Trace

__all__ = ["Observer", "observe", "step_figures", "from_steps", "EVENT_COST_US", "PYTHON_COST_US"]

# Per recorded host event (operator, annotation, runtime/driver call): (low, high) us.
EVENT_COST_US = (2.0, 9.0)
# Per Python frame event (with_stack): (low, high) us. (A low of 2.0 put a rerun of the
# DataLoader-fed CNN's unprofiled step at 2.9-20.8 ms, measured 31.6-38.3 ms.)
PYTHON_COST_US = (0.2, 5.0)
# What an unprofiled eager step costs the host at least, per operator and per launch (us).
FLOOR_OP_US = 1.0
FLOOR_LAUNCH_US = 2.5
# A launch call this many times its median blocked on a full queue (or the allocator).
_BLOCKED_FACTOR = 3.0

# Annotations PyTorch itself opens around its own dispatch (optimizer, autograd, compiled
# graphs, modules): framework overhead even where they launch nothing themselves. An
# operator's own range ("aten::view", "c10d::allreduce_": a lower-case namespace, "::", the
# operator) is dispatch too: Kineto lists operators as cpu_op, but
# torch.autograd.profiler.emit_nvtx writes each as an NVTX range, which an Nsight Systems
# export holds like any annotation. (A user's "MyModel::forward" stays the user's; FSDP's
# own ranges, "FSDP::pre_forward", are the framework's.)
_FRAMEWORK = r"^(?:Optimizer\.|autograd::|## |TorchDynamo|Torch-Compiled|CompiledFunction|nn\.Module:|torch/|FSDP::|[a-z_][a-z0-9_]*::\w)"

_HOST_EVENTS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
# the host events spans are found between (``host_only_spans``)
_HOST_ROWS = pl.col("cat").is_in(_HOST_EVENTS) & ~pl.col("name").str.starts_with("ProfilerStep#") & pl.col("tid").is_not_null()


@dataclass(frozen=True)
class Observer:
    """Per-step figures in ms (medians over GPU-side steps); ``*_lo``/``*_hi`` bound an
    estimate. ``source`` is ``measured`` when an unprofiled step time was given."""

    steps: int
    gpu_step_ms: float
    gpu_work_ms: float
    host_work_ms: float
    events_per_step: int
    python_events_per_step: int
    launches_per_step: int
    profiler_cost_ms_lo: float
    profiler_cost_ms_hi: float
    unprofiled_host_ms_lo: float
    unprofiled_host_ms_hi: float
    bare_step_ms: float | None
    source: str  # "measured" | "estimated"
    event_cost: dict | None = None  # the per-event cost the estimate used (``event_cost.EventCost.to_dict``)

    @property
    def host_excess_ms_lo(self) -> float:
        """Idle per step the host causes without the profiler: at least this much."""
        if self.bare_step_ms is not None:
            return max(0.0, self.bare_step_ms - self.gpu_work_ms)
        return max(0.0, self.unprofiled_host_ms_lo - self.gpu_work_ms)

    @property
    def host_excess_ms_hi(self) -> float:
        """... and at most this much."""
        if self.bare_step_ms is not None:
            return self.host_excess_ms_lo
        return max(0.0, self.unprofiled_host_ms_hi - self.gpu_work_ms)

    @property
    def unprofiled_step_ms(self) -> tuple[float, float]:
        """The step time without the profiler: measured, or the estimate's range."""
        if self.bare_step_ms is not None:
            return self.bare_step_ms, self.bare_step_ms
        return max(self.gpu_work_ms, self.unprofiled_host_ms_lo), max(self.gpu_work_ms, self.unprofiled_host_ms_hi)

    @property
    def inflation(self) -> tuple[float, float] | None:
        """GPU-side step time in the trace over the unprofiled one (range when estimated)."""
        lo, hi = self.unprofiled_step_ms
        if lo <= 0:
            return None
        return round(self.gpu_step_ms / hi, 2), round(self.gpu_step_ms / lo, 2)

    def to_dict(self) -> dict:
        d = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}
        if d["event_cost"] is None:
            del d["event_cost"]
        lo, hi = self.unprofiled_step_ms
        d["unprofiled_step_ms"] = [round(lo, 3), round(hi, 3)]
        d["host_excess_ms"] = [round(self.host_excess_ms_lo, 3), round(self.host_excess_ms_hi, 3)]
        d["inflation"] = self.inflation
        return d


def observe(trace: Trace, step_table: pl.DataFrame, blocking: pl.DataFrame, launches: pl.DataFrame,
            bare_step_ms: float | None = None, host_only: pl.DataFrame | None = None, event_cost=None) -> Observer | None:
    """The observer model of one trace (see the module doc); None without GPU-side steps."""
    return from_steps(step_figures(trace, step_table, blocking, launches, host_only, event_cost), bare_step_ms, event_cost)


def from_steps(per_step: pl.DataFrame | None, bare_step_ms: float | None = None, event_cost=None) -> Observer | None:
    """The observer model from :func:`step_figures`' rows (of one trace, or of the parts of
    one analysed in parts, concatenated): medians over the steps of the device with the most
    GPU work. ``event_cost`` (``event_cost.EventCost``) is the per-event cost they were
    figured at, stated beside them."""
    if per_step is None or per_step.height == 0:
        return None
    dev = per_step.group_by("device").agg(pl.col("busy_ns").sum()).sort("busy_ns", "device", descending=[True, False])["device"][0]
    f = per_step.filter(pl.col("device") == dev)
    med = lambda c: float(f[c].median())  # noqa: E731
    return Observer(
        steps=f.height,
        gpu_step_ms=med("dur_ns") / 1e6,
        gpu_work_ms=med("busy_ns") / 1e6,
        host_work_ms=med("host_work_ms"),
        events_per_step=int(med("events")),
        python_events_per_step=int(med("python")),
        launches_per_step=int(med("launches")),
        profiler_cost_ms_lo=med("cost_lo_ms"),
        profiler_cost_ms_hi=med("cost_hi_ms"),
        unprofiled_host_ms_lo=med("unprofiled_lo_ms"),
        unprofiled_host_ms_hi=med("unprofiled_hi_ms"),
        bare_step_ms=bare_step_ms,
        source="estimated" if bare_step_ms is None else "measured",
        event_cost=event_cost.to_dict() if event_cost is not None else None,
    )


def step_figures(trace: Trace, step_table: pl.DataFrame, blocking: pl.DataFrame, launches: pl.DataFrame,
                 host_only: pl.DataFrame | None = None, event_cost=None) -> pl.DataFrame | None:
    """The observer model's figures per GPU-side step and device (ns, counts, ms as named;
    the host's figures are the step's, on every device's row); None without GPU-side steps.
    ``host_only`` (``host_only_spans``) bounds the profiler's cost where the host did work
    that launches nothing (see the module doc). ``event_cost`` (``event_cost.EventCost``):
    the per-event cost measured from the trace; EVENT_COST_US without one."""
    gs = step_table.filter(pl.col("side") == "gpu") if step_table.height else step_table
    if gs.height == 0:
        return None
    steps = trace.steps.filter(pl.col("step").is_in(gs["step"].unique().implode())).sort("start_ns").unique("step", keep="first", maintain_order=True)
    lo = steps["start_ns"].to_numpy()
    hi = steps["end_ns"].to_numpy()

    # (a flag per event, not its category as text: a million Python strings cost 130 MB)
    host = trace.cpu.select(
        "start_ns", "tid", (pl.col("cat") == "python_function").alias("python")
    ).filter(pl.col("python") | trace.cpu.get_column("cat").is_in(_HOST_EVENTS))
    t, py = host["start_ns"].to_numpy(), host["python"].to_numpy()
    events, python = _counts_per_step(t, py, lo, hi)
    n = len(lo)
    launch_n = np.bincount(_step_of(launches["launch_start_ns"].to_numpy(), lo, hi), minlength=n + 1)[:n]

    blocked = _blocked_ns(blocking, launches, lo, hi)
    host_work = np.maximum((hi - lo) - blocked, 0) / 1e6
    # work that launches nothing on the steps' own threads, and the events recorded inside it
    quiet_ms, events_q, python_q = _quiet_per_step(trace, host, host_only, lo, hi)
    del host, t, py
    quiet_ms = np.minimum(quiet_ms, host_work)
    events_r, python_r = events - events_q, python - python_q
    floor = (events_r * FLOOR_OP_US + launch_n * FLOOR_LAUNCH_US) / 1e3

    measured = event_cost is not None and event_cost.source == "measured"
    per_event = (event_cost.lo_us, event_cost.hi_us) if measured else EVENT_COST_US

    def cost(ev, pyf, end: int) -> np.ndarray:
        return (ev * per_event[end] + pyf * PYTHON_COST_US[end]) / 1e3

    def unprofiled(end: int) -> np.ndarray:
        # each part gives back at most its own events' cost: the quiet part down to nothing,
        # the rest down to what an unprofiled eager step costs
        return (np.maximum(quiet_ms - cost(events_q, python_q, end), 0)
                + np.maximum(host_work - quiet_ms - cost(events_r, python_r, end), floor))  # fmt: skip

    host_side = pl.DataFrame({
        "step": steps["step"], "host_work_ms": host_work, "events": events, "python": python, "launches": launch_n,
        "cost_lo_ms": cost(events, python, 0), "cost_hi_ms": cost(events, python, 1),
        "unprofiled_lo_ms": unprofiled(1), "unprofiled_hi_ms": unprofiled(0),
    })
    return gs.select("step", "device", "dur_ns", "busy_ns").join(host_side, on="step", how="left", maintain_order="left")


def _quiet_per_step(trace: Trace, host: pl.DataFrame, host_only: pl.DataFrame | None, lo: np.ndarray,
                    hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per step (``lo``/``hi``): the time (ms) the threads holding the steps' ranges spent in
    work that launches nothing (``host_only``), and the host events and Python frames
    recorded inside it (of ``host``: start_ns, tid, python, in the trace's host table's order)."""
    n = len(lo)
    zero = np.zeros(n, dtype=np.int64)
    if host_only is None or host_only.height == 0:
        return np.zeros(n), zero, zero
    # (the threads only: not a copy of every column of the rows they are read from)
    own = trace.cpu.lazy().filter(pl.col("name").str.starts_with("ProfilerStep#")).select("tid").collect()["tid"].drop_nulls().unique()
    if own.len() == 0:  # step ranges of no thread (an export's NVTX): the thread that launched most
        own = trace.cpu.lazy().filter(pl.col("cat").is_in(_HOST_EVENTS[2:])).select("tid").collect()["tid"].drop_nulls().mode().head(1)
    spans = host_only.filter(pl.col("tid").is_in(own.implode()))
    if spans.height == 0:
        return np.zeros(n), zero, zero
    # (one thread's spans, or few: their union in plain time)
    quiet = IntervalSet.from_spans(spans["start_ns"].to_numpy(), spans["end_ns"].to_numpy())
    t = host["start_ns"].to_numpy()
    inside = quiet.contains(t)
    inside &= host["tid"].is_in(own.implode()).fill_null(False).to_numpy()
    k = _step_of(t[inside], lo, hi)
    py = host["python"].to_numpy()[inside]
    ev_q = np.bincount(k[~py], minlength=n + 1)[:n]
    py_q = np.bincount(k[py], minlength=n + 1)[:n]
    return quiet.covered_within(lo, hi) / 1e6, ev_q, py_q


def _counts_per_step(t: np.ndarray, flag: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step (``lo``/``hi``, in start order), the times ``t`` held by it without and with
    ``flag``: a time belongs to the last step starting at or before it, where that step has
    not yet ended (``_step_of``). Times in order (a host table's starts) are counted by a
    search of each step's ends among them and running sums of the flag: the 514 MB trace's
    1.2 M host events, 31 -> 8 ms; times out of order, one by one."""
    if not lo.size:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if t.size and not bool((t[1:] >= t[:-1]).all()):
        k = _step_of(t, lo, hi)
        n = len(lo)
        return np.bincount(k[~flag], minlength=n + 1)[:n], np.bincount(k[flag], minlength=n + 1)[:n]
    # a step holds the times from its start to its end or the next step's start, whichever is first
    until = np.minimum(hi, np.append(lo[1:], np.iinfo(np.int64).max))
    first = np.searchsorted(t, lo, side="left")
    past = np.maximum(np.searchsorted(t, until, side="left"), first)
    flagged = np.concatenate([[0], np.cumsum(flag, dtype=np.int64)])
    with_flag = flagged[past] - flagged[first]
    return (past - first) - with_flag, with_flag


def _step_of(t: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Index of the step holding each time, or len(lo) for none (a bincount overflow slot)."""
    k = np.searchsorted(lo, t, side="right") - 1
    ok = (k >= 0) & (t < hi[np.maximum(k, 0)])
    return np.where(ok, k, len(lo))


def _blocked_ns(blocking: pl.DataFrame, launches: pl.DataFrame, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Host time per step spent waiting on the GPU: blocking calls (syncs, blocking copies),
    and launch calls held up on a full queue (the part beyond _BLOCKED_FACTOR x median).
    Waits on different threads at once are counted once (a union per step)."""
    d = launches["launch_end_ns"] - launches["launch_start_ns"]
    med = d.median() or 0
    slow = launches.filter(d > _BLOCKED_FACTOR * med).select(
        (pl.col("launch_start_ns") + int(med)).alias("s"), pl.col("launch_end_ns").alias("e")
    )
    waits = pl.concat([blocking.select(pl.col("sync_start_ns").alias("s"), pl.col("sync_end_ns").alias("e")), slow])
    spans = IntervalSet.from_spans(waits["s"].to_numpy(), waits["e"].to_numpy())
    return spans.covered_within(lo, hi)


# Host time outside any recorded event counts as the program's own work (sleep, I/O, its
# Python) from this length on; shorter stretches are the framework's Python between ops.
QUIET_STRETCH_NS = 200_000


def host_only_spans(trace: Trace, launches: pl.DataFrame, before: pl.DataFrame | None = None) -> pl.DataFrame:
    """Host spans (tid, name, start_ns, end_ns) of work that launches nothing: annotations
    that issued no launch on their own thread and are not PyTorch's own (a DataLoader's
    ``__next__``, the program's record_function around I/O), and stretches of at least
    QUIET_STRETCH_NS between two recorded operators, annotations or runtime calls of a thread
    (named ``(outside operators)``; none before a thread's first event or after its last). A
    part of a trace analysed in parts reads them up to the next part's first launch
    (``_with_next_part``).

    One pass over the host events in (thread, start) order: a stable order by thread rank
    (``ThreadClock.thread_order``; the host table is in start order already), then, a chunk
    of events at a time, their keys, a search of each start among the launches (in order) and
    a running maximum of ends (carried from chunk to chunk) for the stretches between them. On
    a 13.8 M event export: 0.74-0.77 s, its arrays at most 116 MiB beside the 44 MiB of selected
    rows (a radix sort of every row's rank, after gathering their 88 MiB of thread ids: 154 MiB
    beside them, 1.2-1.4 s), where a sort of all threads' keys and searches in row order took
    2.45 s and 427 MiB (and ran a thread's last event into the next thread's first)."""
    empty = pl.DataFrame(schema={"tid": pl.Int64, "name": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64})
    cpu, launches = _with_next_part(trace, launches, before)
    rows = cpu.select(_HOST_ROWS.arg_true().alias("row"))["row"]
    if rows.len() == 0:
        return empty
    lt = launches.drop_nulls("tid")
    bounds = cpu.select(pl.col("start_ns").min().alias("lo"), (pl.col("start_ns") + pl.col("dur_ns")).max().alias("hi")).row(0)
    # every host event's thread band: ranking the whole column costs 2 bytes a row, where the
    # selected rows' thread ids gathered first cost 8
    clock = ThreadClock([cpu.get_column("tid"), lt["tid"]], [pl.Series(bounds, dtype=pl.Int64), lt["launch_start_ns"]])
    rows = rows.to_numpy()
    rank = clock.rank(cpu.get_column("tid"))[rows]
    # (thread, start) order: the host table is in start order, so a stable order by thread
    order, per_thread = clock.thread_order(rank)
    rank = np.repeat(np.arange(per_thread.size, dtype=rank.dtype), per_thread)
    # the launches' keys, and past the last one a key no event reaches
    keys = np.sort(clock.key(lt["tid"], lt["launch_start_ns"]))
    keys = np.append(keys, np.iinfo(keys.dtype).max)
    starts, durs = cpu.get_column("start_ns"), cpu.get_column("dur_ns")
    quiet = []  # rows of events that launched nothing
    gs, ge = [], []  # stretches between a thread's events: where one starts past every end before it
    reach = last = None  # the running maximum of ends, and the thread, where the chunk before ended
    for i, j in _chunks(rank.size):
        # keys of a chunk of events at a time: its temporaries, not four arrays of every event
        r = rank[i:j]
        at = rows[order[i:j]]
        s = _gathered(starts, at)
        e = _gathered(durs, at)
        e += s
        s = clock.key_ranked(r, s)
        e = clock.key_ranked(r, e)
        # a launch in [start, end): one at the instant an annotation ends is the next work's,
        # as a range's GPU work is counted (analysis.timeline.ranges). The event launched nothing if
        # the first launch at or after its start is at or past its end: one search, of the
        # starts, which are in order (searching the ends too: 0.97 s in all, not 0.74-0.77)
        quiet.append(at[keys[_first_at_or_after(keys, s)] >= e])
        np.maximum.accumulate(e, out=e)
        if reach is not None:
            np.maximum(e, reach, out=e)
            if s[0] - reach >= QUIET_STRETCH_NS and r[0] == last:
                gs.append(np.array([reach]))
                ge.append(s[:1])
        opens = np.flatnonzero((s[1:] - e[:-1] >= QUIET_STRETCH_NS) & (r[1:] == r[:-1]))
        gs.append(e[opens])
        ge.append(s[opens + 1])
        reach, last = e[-1], r[-1]
    del keys, rank, order, rows, s, e
    gs, ge = np.concatenate(gs), np.concatenate(ge)
    quiet = pl.Series(np.concatenate(quiet))
    quiet = quiet.filter(_annotation(cpu.get_column("cat").gather(quiet), cpu.get_column("name").gather(quiet)))
    quiet = _not_framework(cpu.get_column("name"), quiet)
    tid, t0 = clock.unkey(gs)
    tid, t0, t1 = _not_waiting(cpu, quiet.to_numpy(), lt["tid"].unique(), tid, t0, t0 + (ge - gs))
    quiet = cpu.select(pl.col("tid", "name", "start_ns").gather(quiet), (pl.col("start_ns") + pl.col("dur_ns")).gather(quiet).alias("end_ns"))
    bare = pl.DataFrame({"tid": tid, "name": pl.Series(["(outside operators)"] * t0.size, dtype=pl.String), "start_ns": t0, "end_ns": t1})
    return (
        pl.concat([quiet.cast({"tid": pl.Int64}), bare.cast({"tid": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64})])
        .filter(pl.col("end_ns") > pl.col("start_ns"))
        .sort("start_ns", "tid", maintain_order=True)
    )


def _annotation(cat: pl.Series, name: pl.Series) -> pl.Series:
    """Per host row (its ``cat`` and ``name``), whether it is a range the program or PyTorch opened (record_function)
    rather than an operator: ``user_annotation`` rows, and, in traces of PyTorch 1.8-1.9 that
    file every range as an operator (category ``Operator``), operator rows named as PyTorch
    names its ranges, ``label#qualifier`` (``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__``,
    ``Optimizer.step#SGD.step``), which no operator's name is."""
    return ((cat == "user_annotation") | ((cat == "cpu_op") & name.str.contains("#", literal=True))).fill_null(False)


def _not_waiting(cpu: pl.DataFrame, quiet: np.ndarray, launching: pl.Series, tid: np.ndarray, t0: np.ndarray,
                 t1: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The stretches outside a thread's events (``tid``, ``t0``, ``t1``) less the time another
    thread that launches GPU work was inside a recorded event other than an annotation that
    launched nothing (``quiet``: rows of ``cpu``), in pieces of at least QUIET_STRETCH_NS.
    A thread that records nothing while another dispatches is waiting on it, not working:
    the main thread inside ``loss.backward()`` while autograd's thread runs the backward
    (2-3 ms a step of a CNN's), autograd's thread while the main one runs the forward. Only
    time when no dispatching thread records work is the program's own (a thread's own
    events never overlap its stretches, so the union of all dispatching threads' serves).
    The events are read a chunk at a time, and only those over a stretch are kept."""
    if t0.size == 0 or launching.len() == 0:
        return tid, t0, t1
    windows = IntervalSet.from_spans(t0, t1)
    rows = cpu.select((_HOST_ROWS & pl.col("tid").is_in(launching.implode())).arg_true().alias("row"))["row"].to_numpy()
    if quiet.size:
        rows = rows[~np.isin(rows, quiet)]
    starts, durs = cpu.get_column("start_ns"), cpu.get_column("dur_ns")
    cs, ce = [], []
    for i, j in _chunks(rows.size):
        s = _gathered(starts, rows[i:j])
        e = s + _gathered(durs, rows[i:j])
        over = windows.covered_within(s, e) > 0
        cs.append(s[over])
        ce.append(e[over])
    busy = IntervalSet.from_spans(np.concatenate(cs), np.concatenate(ce))
    if quiet.size:  # (the operators inside an annotation that launched nothing are its work: a collate's)
        q0 = _gathered(starts, quiet)
        quiet_set = IntervalSet.from_spans(q0, q0 + _gathered(durs, quiet))
        _, b0, b1 = _uncovered(busy.starts, busy.ends, quiet_set)
        busy = IntervalSet(b0, b1)
    at, p0, p1 = _uncovered(t0, t1, busy)
    keep = p1 - p0 >= QUIET_STRETCH_NS
    return tid[at][keep], p0[keep], p1[keep]


def _uncovered(t0: np.ndarray, t1: np.ndarray, cover: IntervalSet) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pieces of spans [t0, t1) that ``cover`` leaves uncovered: each piece's span index
    and its bounds (ns), in span order."""
    if len(cover) == 0 or t0.size == 0:
        return np.arange(t0.size), t0, t1
    fs, fe = cover.gaps(int(t0.min()), int(t1.max()))
    a = np.searchsorted(fe, t0, side="right")  # the first uncovered span ending past t0
    b = np.searchsorted(fs, t1, side="left")  # past the last one starting before t1
    n = np.maximum(b - a, 0)
    at = np.repeat(np.arange(t0.size), n)
    k = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n) + np.repeat(a, n)
    p0, p1 = np.maximum(t0[at], fs[k]), np.minimum(t1[at], fe[k])
    ok = p1 > p0
    return at[ok], p0[ok], p1[ok]


def host_reach(cpu: pl.DataFrame) -> pl.DataFrame:
    """Per thread (``tid``), the latest end (``end_ns``) of the host events the spans are
    found between: what a part of a trace analysed in parts passes on to the parts after it
    (``host_only_spans``' ``before``)."""
    return (
        cpu.select("cat", "name", "tid", "start_ns", "dur_ns").filter(_HOST_ROWS)
        .group_by("tid").agg((pl.col("start_ns") + pl.col("dur_ns")).max().alias("end_ns"))
    )  # fmt: skip


def _with_next_part(trace: Trace, launches: pl.DataFrame, before: pl.DataFrame | None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The host events and launches the spans are found in. A part of a trace analysed in
    parts reads them as the whole trace would: ``before`` (``host_reach`` of the parts before
    it) enters each thread's running end first, as one event ending there (a stretch from a
    thread's last event before the part to its first in it is found; one only the
    earlier events' ends cover is not); and the next part's host events up to its first
    work's launch (``Trace.next_part_host``) and those launches come after the part's own:
    the gap that work ends is this part's, and so are the spans in it (a DataLoader's
    ``__next__`` at the next step's start). Those start at or after the part's last host
    event starts, so the table stays in start order but for the events of ``before``, which
    are each their thread's first."""
    cpu, ahead = trace.cpu, trace.next_part_host
    frames = [cpu]
    if before is not None and before.height:
        frames.insert(0, before.select(
            pl.lit(_HOST_EVENTS[0]).alias("cat"), pl.lit("").alias("name"), "tid", pl.col("end_ns").alias("start_ns"), pl.lit(0).alias("dur_ns"),
        ).with_columns(pl.lit(None).alias(c) for c in cpu.columns if c not in ("cat", "name", "tid", "start_ns", "dur_ns")))  # fmt: skip
    if ahead is not None and ahead.height:
        frames.append(ahead)
        first = [(w.tid, w.launch_start_ns) for w in trace.meta.next_part_work if w.tid is not None and w.launch_start_ns is not None]
        schema = {"tid": launches.schema["tid"], "launch_start_ns": launches.schema["launch_start_ns"]}
        launches = pl.concat([launches.select(list(schema)), pl.DataFrame(first, schema=schema, orient="row")])
    if len(frames) == 1:
        return cpu, launches
    return pl.concat([f.select(cpu.columns).cast(cpu.schema) for f in frames], rechunk=False), launches


def _gathered(column: pl.Series, rows: np.ndarray) -> np.ndarray:
    """``column``'s values at ``rows`` as a writable array of their own: gathered by numpy from
    the column's buffer where it has no nulls (one array, where polars' gather and a writable
    copy of it were two: 92 MiB each for 11.5 M events)."""
    if column.null_count() or column.n_chunks() > 1:
        return column.gather(pl.Series(rows)).to_numpy(writable=True)
    return column.to_numpy()[rows]


def _first_at_or_after(keys: np.ndarray, s: np.ndarray) -> np.ndarray:
    """``np.searchsorted(keys, s, side="left")`` (``keys`` sorted): where ``s`` is in order too
    and fewer keys fall in its range than it has values, the keys are searched among ``s``
    instead and the counts summed up (each key before ``s[j]`` is counted at every j past its
    place): a search per launch, not per event. An export's 11.5 M host events among 1.8 M
    launches: 233 -> 76 ms."""
    if s.size < 2:
        return np.searchsorted(keys, s, side="left")
    lo, hi = np.searchsorted(keys, (s[0], s[-1]), side="left")  # keys below s[0]; below s[-1]
    if hi - lo >= s.size or not (s[1:] >= s[:-1]).all():
        return np.searchsorted(keys, s, side="left")
    # s[j] is past keys[k] (lo <= k < hi) from j = searchsorted(s, keys[k], "right") on
    past = np.bincount(np.searchsorted(s, keys[lo:hi], side="right"), minlength=s.size)[: s.size]
    found = np.cumsum(past)
    found += lo
    return found


def _not_framework(names: pl.Series, rows: pl.Series) -> pl.Series:
    """The rows whose name is not PyTorch's own (``_FRAMEWORK``): the pattern once per distinct
    name (an emit_nvtx export has millions of operator ranges, a few hundred names), the
    names gathered a chunk of rows at a time (16 bytes a row), once: each chunk's names not
    seen before are tested, then its rows kept, with no second gather of its names (an
    export's 7 M annotations that launched nothing, 176 names: 199 -> 172 ms)."""
    seen = own = pl.Series(dtype=pl.String)
    kept = []
    for i, j in _chunks(rows.len()):
        got = names.gather(rows[i:j])
        new = got.unique()
        new = new.filter(~new.is_in(seen.implode()))
        if new.len():
            seen, own = pl.concat([seen, new]), pl.concat([own, new.filter(new.str.contains(_FRAMEWORK))])
        kept.append(rows[i:j].filter(~got.is_in(own.implode())) if own.len() else rows[i:j])
    return pl.concat(kept)


def _chunks(n: int) -> list[tuple[int, int]]:
    """[i, j) ranges of _CHUNK_ROWS over n rows: the per-event work runs a chunk at a time, so
    its temporaries (8-byte index arrays, 16-byte names) are bounded, not an event's worth each."""
    return [(i, min(i + _CHUNK_ROWS, n)) for i in range(0, n, _CHUNK_ROWS)] or [(0, 0)]


# (2 MiB per 8-byte array: host-only spans' arrays peaked at 141 MiB with 1 M-row chunks on
# a 13.8 M event export, 116 MiB with these; tracemalloc)
_CHUNK_ROWS = 1 << 18
