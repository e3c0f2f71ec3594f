"""The step graph the what-if model replays: the host calls that drive one device and the GPU
work they launch, over a few analysed steps, as arrays.

The host side is the sequence of CUDA runtime/driver calls of every thread that launches onto
the device, merged in start order. In a training loop those threads take turns (the main
thread waits while autograd's thread runs the backward pass), so the merged sequence is the
host's critical path; the time between one call's end and the next call's start is the
host's *work* there: operator dispatch, the framework's Python, the program's own Python, a
DataLoader. Each stretch of work carries what it is made of, for the fixes to act on: the
host events the profiler recorded in it (its own cost, ``observer``), the time covered by work
that launches nothing on the calling thread (``observer.host_only_spans``), split into input
pipeline and the rest, and whether it lies inside the optimizer's step.

The GPU side is each operation (kernel, copy, memset) on the device with the call that
launched it (CUPTI correlation), its stream, and the operation on another stream it waited
for where the timing shows a wait nothing else explains (an event, a stream wait: the
operation started later than its launch and its stream allowed, right after another
stream's operation ended).

Each call also carries whether it falls in its step's forward and backward
(:func:`_forward_backward`): what ``torch.compile(mode="reduce-overhead")`` captures in CUDA
graphs of an eager program, the optimizer, the batch fetch and the code after the backward
left out.
"""

from __future__ import annotations

import re
import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import polars as pl

from proflab.analysis.timeline.calls import IS_CALL
from proflab.analysis.timeline.gaps import _SYNC_CALL

__all__ = ["StepGraph", "build_graph", "concat", "kept", "call_ops", "LAUNCH", "SYNC", "COPY", "FREE", "OTHER", "MAX_STEPS"]

# call kinds
LAUNCH, SYNC, COPY, FREE, OTHER = 0, 1, 2, 3, 4
MAX_STEPS = 32  # steps replayed: the middle ones of a longer trace ...
MAX_CALLS = 300_000  # ... and fewer where their host calls would be more than this (a replay is a walk over them)
DEP_TOLERANCE_NS = 3_000  # an operation that starts this much later than its launch and stream allow waited
DEFAULT_LATENCY_NS = 4_000  # launch to start on an idle stream, where the trace shows none
_LOADER = r"(?i)dataloader|_next_data|__next__|collate"
_FREE = r"^(?:cudaFree|cuMemFree)(?:_v\d+)?$"
_HOST_EVENTS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")


class Tail(NamedTuple):
    """A part's work after its last call: the host events and Python frames it holds, and where
    the part's host events end (ns, past the last one's start), which the next part's first
    stretch of work continues."""

    events: int
    python: int
    cut: int


class Head(NamedTuple):
    """A part's first stretch of work and its first call: the starts (ns, in order) of the host
    events and Python frames they hold (the frames open across the part's cut among them, from
    the thread's start), and the input pipeline's and the other quiet spans (tid, start_ns,
    end_ns) of the first call's thread that start before it."""

    events: np.ndarray
    python: np.ndarray
    loader: pl.DataFrame
    quiet: pl.DataFrame


@dataclass
class StepGraph:
    """Host calls (``call_*``, merged in start order) and GPU operations (``op_*``) of one
    device over ``steps``; times in ns. See the module doc."""

    device: int
    steps: list[int]
    call_start: np.ndarray
    call_dur: np.ndarray
    call_kind: np.ndarray  # LAUNCH | SYNC | COPY (a copy the host waits for) | FREE | OTHER
    call_name: np.ndarray  # object
    call_step: np.ndarray  # the step the call belongs to, -1 outside the analysed steps
    call_optimizer: np.ndarray  # bool: inside the optimizer's step
    work: np.ndarray  # host work before each call (ns)
    work_events: np.ndarray  # host events recorded in that work, the call included
    work_python: np.ndarray  # Python frames recorded in it
    work_loader: np.ndarray  # of it, ns in the input pipeline (work that launches nothing)
    work_quiet: np.ndarray  # ns in other work that launches nothing (the program's Python, sleeps)
    op_start: np.ndarray
    op_dur: np.ndarray
    op_stream: np.ndarray
    op_kind: np.ndarray  # object: kernel | memcpy | memset
    op_name: np.ndarray  # object
    op_call: np.ndarray  # the launching call
    op_dep: np.ndarray  # an operation on another stream this one waited for, or -1
    op_pageable: np.ndarray  # bool: a copy to or from pageable host memory
    op_bytes: np.ndarray  # copies: bytes (0 where unknown)
    op_comm: np.ndarray  # bool: a collective's kernel
    op_copy: np.ndarray  # object: a copy's direction (HtoD, DtoH, ...), None for others
    op_gap: np.ndarray  # after the previous operation of the same call (a CUDA graph's), the GPU's own gap (ns)
    op_comm_bytes: np.ndarray  # a collective's payload (bytes, from record_param_comms; 0 where unknown)
    latency_ns: int  # launch to start on an idle stream (median)
    wake_ns: int  # a sync's return after the GPU drained (median)
    # a part of a trace analysed in parts: what its work after its last call and its first
    # stretch of work hold, for :func:`concat` to join at its seams (None: not a part)
    tail: Tail | None = None
    head: Head | None = None
    # bool per call: inside a compiled region (torch.compile's code: ``timeline.compiled``); None: no region
    call_region: np.ndarray | None = None
    # bool per call: inside its step's forward and backward (``_forward_backward``); None where
    # the trace shows no backward pass; ``fwbw_how``: how the span was found, or why it was not
    call_fwbw: np.ndarray | None = None
    fwbw_how: str = ""

    @property
    def n_calls(self) -> int:
        return int(self.call_start.size)

    @property
    def region(self) -> np.ndarray:
        """Per call, whether it ran inside a compiled region (all False where none ran)."""
        return self.call_region if self.call_region is not None else np.zeros(self.n_calls, dtype=bool)


def call_ops(g: StepGraph) -> tuple[np.ndarray, np.ndarray]:
    """Each call's operations in operation order, as offsets and indices: those of call ``i``
    are ``ops[ptr[i]:ptr[i + 1]]``. Made once a graph (every replay and some fixes read them)."""
    got = g.__dict__.get("_call_ops")
    if got is None:
        ops = np.argsort(g.op_call, kind="stable").astype(np.int64)
        ptr = np.zeros(g.n_calls + 1, dtype=np.int64)
        np.cumsum(np.bincount(g.op_call, minlength=g.n_calls), out=ptr[1:])
        got = g.__dict__["_call_ops"] = (ptr, ops)
    return got


def kept(g: StepGraph) -> StepGraph:
    """``g`` as a part of a trace analysed in parts keeps it until all parts are replayed as
    one: without what its replays added to it (``call_ops``, the fixes' name lookups)."""
    return dataclasses.replace(g)


def _shared(col: pl.Series) -> tuple[np.ndarray, np.ndarray, list]:
    """An object array of text in which equal values are one Python object (a kernel's name
    is hundreds of characters and launched thousands of times a step, and each part of a
    trace analysed in parts keeps its graph), each value's index among the distinct values,
    and those. The values are matched in polars (a hash join), and only the distinct ones become
    Python objects: a dictionary over every value cost 3x as much (40 ms against 13 for 200 k
    kernel names)."""
    distinct = col.unique().to_frame("v").with_row_index("code")
    codes = col.to_frame("v").join(distinct, on="v", how="left", nulls_equal=True, maintain_order="left")["code"].to_numpy()
    values = np.empty(distinct.height, dtype=object)
    values[:] = distinct["v"].to_list()
    return values[codes], codes.astype(np.int64), values.tolist()


def _choose_steps(ctx, min_steps: int = 2) -> tuple[int, list[int]] | None:
    """The device with the most GPU work and its GPU-side steps to replay (the middle
    MAX_STEPS of them); None with fewer than ``min_steps`` GPU-side steps."""
    st = ctx.step_table
    if st.height == 0:
        return None
    gs = st.filter(pl.col("side") == "gpu") if "side" in st.columns else st
    if gs.height == 0:
        return None
    dev = gs.group_by("device").agg(pl.col("busy_ns").sum()).sort("busy_ns", "device", descending=[True, False])["device"][0]
    steps = sorted(int(s) for s in gs.filter(pl.col("device") == dev)["step"].unique())
    if len(steps) < min_steps:
        return None
    calls = ctx.launches.height  # (launches, most of the calls)
    keep = max(2, min(MAX_STEPS, int(len(steps) * MAX_CALLS / max(calls, 1))))
    if len(steps) > keep:
        a = (len(steps) - keep) // 2
        steps = steps[a : a + keep]
    return int(dev), steps


def _covered(spans: pl.DataFrame, tid: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per window [a, b) on thread ``tid``, the ns the ``spans`` (tid, start_ns, end_ns) of that
    thread cover (a span list merged per thread, then a cumulative coverage looked up)."""
    out = np.zeros(a.size, dtype=np.int64)
    if spans.height == 0 or a.size == 0:
        return out
    for t, s in spans.group_by("tid"):
        sel = np.flatnonzero(tid == t[0])
        if sel.size == 0:
            continue
        s = s.sort("start_ns")
        st, en = s["start_ns"].to_numpy(), s["end_ns"].to_numpy()
        # merge overlaps
        en = np.maximum.accumulate(en)
        keep = np.ones(st.size, dtype=bool)
        keep[1:] = st[1:] > en[:-1]
        ms = st[keep]
        me = np.maximum.reduceat(en, np.flatnonzero(keep))
        cum = np.concatenate([[0], np.cumsum(me - ms)])

        def upto(x):  # coverage of (-inf, x): the merged spans before x's, and x's up to x
            k = np.searchsorted(ms, x, side="right")  # spans starting at or before x
            at = np.maximum(k - 1, 0)
            return np.where(k > 0, cum[at] + np.clip(x - ms[at], 0, (me - ms)[at]), 0)

        out[sel] = np.maximum(upto(b[sel]) - upto(a[sel]), 0)
    return out


def build_graph(trace, ctx, min_steps: int = 2) -> StepGraph | None:
    """The step graph of ``trace`` (through its analysis context ``ctx``), or None where the
    trace cannot give one: fewer than ``min_steps`` GPU-side steps (a replay times a step by
    the next one's start: a part of a trace analysed in parts gives its graph with one, for
    :func:`concat`), or no host launches tied to the GPU work."""
    chosen = _choose_steps(ctx, min_steps)
    if chosen is None or not ctx.has_launch_links:
        return None
    device, steps = chosen
    hs = trace.steps.filter(pl.col("step").is_in(steps)).sort("start_ns").unique("step", keep="first", maintain_order=True)
    if hs.height < min_steps:
        return None
    lo, hi = int(hs["start_ns"].min()), int(hs["end_ns"].max())
    if min_steps < 2 and trace.cpu.height and trace.meta.next_part_work:
        # a part of a trace analysed in parts, but the last: its host calls up to its cut, those
        # between its last step and the next part's first included (a whole analysis replays
        # them too; after the last step, neither does)
        hi = max(hi, int(trace.cpu["start_ns"].max()) + 1)
    ops = (
        trace.gpu.select("kind", "name", "device", "stream", "start_ns", "dur_ns", "correlation", "external_id", "bytes", "copy_kind", "src_kind", "dst_kind", "is_comm")
        .filter((pl.col("device") == device) & pl.col("correlation").is_not_null())
    )
    launches = ctx.launches.select("correlation", "tid", "launch_start_ns")
    ops = ops.join(launches, on="correlation", how="inner").filter(
        (pl.col("launch_start_ns") >= lo) & (pl.col("launch_start_ns") < hi)
    ).sort("start_ns")
    if ops.height == 0:
        return None
    tids = ops["tid"].unique().implode()
    calls = (
        trace.cpu.select("cat", "name", "tid", "start_ns", "dur_ns", "correlation")
        .filter(IS_CALL & pl.col("tid").is_in(tids) & (pl.col("start_ns") >= lo) & (pl.col("start_ns") < hi))
        .sort("start_ns", "dur_ns", descending=[False, True])
        .unique(["tid", "start_ns"], keep="first", maintain_order=True)
    )
    n = calls.height
    call_start = calls["start_ns"].to_numpy().astype(np.int64)
    call_dur = calls["dur_ns"].to_numpy().astype(np.int64)
    call_end = call_start + call_dur
    call_tid = calls["tid"].to_numpy()
    call_name, call_codes, call_names = _shared(calls["name"].fill_null(""))  # (a call whose name an export lost: no name)
    corr = calls["correlation"].fill_null(-1).to_numpy()

    # the operations, each tied to its call by correlation id
    order = np.argsort(corr, kind="stable")
    pos = np.searchsorted(corr[order], ops["correlation"].to_numpy())
    pos = np.clip(pos, 0, max(n - 1, 0))
    hit = corr[order][pos] == ops["correlation"].to_numpy()
    ops = ops.filter(pl.Series(hit))
    op_call = order[pos[hit]]
    op_start = ops["start_ns"].to_numpy().astype(np.int64)
    op_dur = ops["dur_ns"].to_numpy().astype(np.int64)
    op_stream = ops["stream"].fill_null(-1).to_numpy()
    op_kind, _, _ = _shared(ops["kind"].cast(pl.String))
    pageable = ((ops["src_kind"].cast(pl.String) == "Pageable") | (ops["dst_kind"].cast(pl.String) == "Pageable")).fill_null(False).to_numpy()
    op_pageable = pageable & (op_kind == "memcpy")

    kind = np.full(n, OTHER, dtype=np.int8)
    kind[op_call] = LAUNCH
    # (each pattern once per distinct name: a step's calls are a few dozen names, repeated)
    name_col = calls["name"].fill_null("")
    distinct = name_col.unique().to_list()
    kind[name_col.is_in([x for x in distinct if re.search(_SYNC_CALL, x)]).to_numpy()] = SYNC
    kind[op_call[op_pageable]] = COPY
    kind[name_col.is_in([x for x in distinct if re.match(_FREE, x)]).to_numpy()] = FREE

    # host work before each call: from the merged sequence's latest end to the call's start
    reach = np.maximum.accumulate(call_end)
    prev = np.concatenate([[call_start[0]], reach[:-1]])
    work = np.maximum(call_start - prev, 0)

    # the host events recorded in each stretch of work (and the call), for the profiler's cost;
    # a part's first stretch from where its events start (the part before holds the rest)
    part = min_steps < 2
    first = int(trace.cpu["start_ns"].min()) if part and trace.cpu.height else lo
    ev = trace.cpu.select("cat", "name", "start_ns").filter(
        pl.col("cat").is_in(_HOST_EVENTS) & ~pl.col("name").str.starts_with("ProfilerStep#") & (pl.col("start_ns") >= first) & (pl.col("start_ns") < hi)
    )["start_ns"].sort().to_numpy()
    py = trace.cpu.select("cat", "start_ns").filter((pl.col("cat") == "python_function") & (pl.col("start_ns") >= first) & (pl.col("start_ns") < hi))["start_ns"].sort().to_numpy()
    a = np.minimum(prev, call_start)
    if part:
        a[0] = min(first, int(a[0]))
    work_events = np.searchsorted(ev, call_end, side="right") - np.searchsorted(ev, a, side="left")
    work_python = np.searchsorted(py, call_end, side="right") - np.searchsorted(py, a, side="left")

    # work that launches nothing, on the calling thread, inside each stretch
    ho = ctx.host_only.filter((pl.col("end_ns") > first) & (pl.col("start_ns") < hi))
    loader = ho.filter(pl.col("name").str.contains(_LOADER))
    quiet = ho.filter(~pl.col("name").str.contains(_LOADER))
    span = np.maximum(call_start - a, 0)
    work_loader = np.minimum(_covered(loader, call_tid, a, call_start), span)
    work_quiet = np.minimum(_covered(quiet, call_tid, a, call_start), span - work_loader)
    tail = head = None
    if part:  # after the last call, up to the part's cut: the next part's first stretch continues it
        end = int(reach[-1])
        tail = Tail(int(np.searchsorted(ev, hi) - np.searchsorted(ev, end)), int(np.searchsorted(py, hi) - np.searchsorted(py, end)), hi)
        before = (pl.col("tid") == call_tid[0]) & (pl.col("start_ns") < call_start[0])
        head = Head(ev[: np.searchsorted(ev, call_end[0], side="right")], py[: np.searchsorted(py, call_end[0], side="right")],
                    loader.filter(before).select("tid", "start_ns", "end_ns"), quiet.filter(before).select("tid", "start_ns", "end_ns"))

    opt = trace.cpu.select("cat", "name", "tid", "start_ns", "dur_ns").filter(
        pl.col("cat").is_in(["user_annotation", "cpu_op"]) & pl.col("name").str.starts_with("Optimizer.step#")
        & (pl.col("start_ns") < hi) & (pl.col("start_ns") + pl.col("dur_ns") > lo)
    ).select("tid", "start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))
    call_optimizer = _covered(opt, call_tid, call_start, call_start + 1) > 0
    regions = ctx.regions[0].filter((pl.col("start_ns") < hi) & (pl.col("end_ns") > lo))
    call_region = _covered(regions, call_tid, call_start, call_start + 1) > 0 if regions.height else None
    # Python inside the optimizer's step is its dispatch (a per-parameter loop), not the
    # program's own work: the optimizer's fix takes it, the host-work fix does not
    work_quiet[call_optimizer] = 0

    hs_start, hs_end, hs_step = hs["start_ns"].to_numpy(), hs["end_ns"].to_numpy(), hs["step"].to_numpy()
    k = np.searchsorted(hs_start, call_start, side="right") - 1
    inside = (k >= 0) & (call_start < hs_end[np.maximum(k, 0)])
    call_step = np.where(inside, hs_step[np.maximum(k, 0)], -1)
    call_fwbw, fwbw_how = _forward_backward(trace, hs_start, hs_end, call_tid, call_start, np.where(inside, k, -1), lo, hi)

    # launch latency on an idle stream, and cross-stream waits
    m = op_start.size
    op_dep = np.full(m, -1, dtype=np.int64)
    pred_end = np.full(m, np.iinfo(np.int64).min, dtype=np.int64)
    for s in np.unique(op_stream):
        idx = np.flatnonzero(op_stream == s)  # in start order
        ends = op_start[idx] + op_dur[idx]
        pred_end[idx[1:]] = np.maximum.accumulate(ends)[:-1]
    ready = call_start[op_call]
    idle = pred_end < ready
    lat = op_start[idle] - ready[idle]
    lat = lat[(lat >= 0) & (lat < 1_000_000)]
    latency = int(np.median(lat)) if lat.size else DEFAULT_LATENCY_NS
    late = op_start > np.maximum(ready + latency, pred_end) + DEP_TOLERANCE_NS
    if late.any() and np.unique(op_stream).size > 1:
        op_dep = _waits(op_start, op_dur, op_stream, late)

    # a sync's return after the GPU drained: its end past the last end of the work launched before it
    by_launch = np.argsort(ready, kind="stable")
    done = np.maximum.accumulate((op_start + op_dur)[by_launch])
    syncs = np.flatnonzero(kind == SYNC)
    k = np.searchsorted(ready[by_launch], call_start[syncs], side="left") - 1
    w = np.where(k >= 0, call_end[syncs] - done[np.maximum(k, 0)], -1)
    wake = w[(w >= 0) & (w < 200_000)]
    comm_bytes = _comm_bytes(trace, ops)
    op_name, name_codes, distinct_names = _shared(ops["name"])
    # one call, many operations (a CUDA graph's replay): the GPU's own spacing between them
    op_gap = np.zeros(m, dtype=np.int64)
    by_call = np.argsort(op_call, kind="stable")
    a, b = by_call[:-1], by_call[1:]
    same = op_call[a] == op_call[b]
    op_gap[b[same]] = np.clip(op_start[b[same]] - (op_start[a[same]] + op_dur[a[same]]), 0, 50_000)
    g = StepGraph(
        device=device, steps=[int(s) for s in hs_step], call_start=call_start, call_dur=call_dur, call_kind=kind,
        call_name=call_name, call_step=call_step, call_optimizer=call_optimizer, work=work, work_events=work_events,
        work_python=work_python, work_loader=work_loader, work_quiet=work_quiet, op_start=op_start, op_dur=op_dur,
        op_stream=op_stream, op_kind=op_kind, op_name=op_name, op_call=op_call, op_dep=op_dep,
        op_pageable=op_pageable, op_bytes=ops["bytes"].fill_null(0).to_numpy(), op_comm=ops["is_comm"].fill_null(False).to_numpy(), op_copy=_shared(ops["copy_kind"].cast(pl.String))[0], op_gap=op_gap, op_comm_bytes=comm_bytes,
        latency_ns=latency, wake_ns=int(np.median(wake)) if wake.size else 3_000, tail=tail, head=head,
        call_region=call_region, call_fwbw=call_fwbw, fwbw_how=fwbw_how,
    )  # fmt: skip
    # the distinct names, as the fixes look them up (``fixes._distinct_names``): known already
    g.__dict__["_distinct_names"] = (["" if v is None else str(v) for v in distinct_names], name_codes)
    g.__dict__["_distinct_call_name"] = (call_names, call_codes)
    return g


_BACKWARD = "autograd::engine::evaluate_function"
_OPTIMIZER_RANGES = ("Optimizer.step#", "Optimizer.zero_grad#")


def _forward_backward(trace, hs_start: np.ndarray, hs_end: np.ndarray, call_tid: np.ndarray, call_start: np.ndarray,
                      call_k: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray | None, str]:
    """Per call, whether it falls in its step's forward and backward, and how that span was
    found (or why not). ``call_k``: each call's index among the steps (``hs_start``/``hs_end``,
    ns), -1 outside them.

    The backward is autograd's pass: its ``autograd::engine::evaluate_function`` ranges (on
    its own thread for GPU work), first start to last end within the step. The forward starts
    at the first ``nn.Module`` range before the backward where the trace records them
    (with_stack), else at the step's start or the end of the optimizer's last range before the
    backward (a zero_grad at the top of the loop). The optimizer's ranges are never in it.
    Without module ranges the batch fetch and the loss, where the program makes them between
    the step's start and the backward, count as forward: the span is then an upper bound of
    what a compiled model captures."""
    cpu = trace.cpu.select("cat", "name", "tid", "start_ns", "dur_ns").filter(
        (pl.col("start_ns") < hi) & (pl.col("start_ns") + pl.col("dur_ns") > lo)
    ).with_columns(end_ns=pl.col("start_ns") + pl.col("dur_ns"))
    bwd = cpu.filter((pl.col("cat") == "cpu_op") & pl.col("name").str.starts_with(_BACKWARD))
    if bwd.height == 0:
        return None, ("the trace records no backward pass (no autograd::engine ranges): which launches are the "
                      "forward and backward it cannot tell, so only the optimizer's ranges are left out")
    n = hs_start.size

    def step_of(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(hs_start, t, side="right") - 1
        return np.where((k >= 0) & (t < hs_end[np.maximum(k, 0)]), k, -1)

    bs, be = bwd["start_ns"].to_numpy(), bwd["end_ns"].to_numpy()
    kb = step_of(bs)
    b0, b1 = np.full(n, np.iinfo(np.int64).max), np.full(n, np.iinfo(np.int64).min)
    np.minimum.at(b0, kb[kb >= 0], bs[kb >= 0])
    np.maximum.at(b1, kb[kb >= 0], be[kb >= 0])
    has = b1 > b0
    f0 = hs_start.astype(np.int64).copy()
    opt = cpu.filter(pl.col("cat").is_in(["user_annotation", "cpu_op"])
                     & (pl.col("name").str.starts_with(_OPTIMIZER_RANGES[0]) | pl.col("name").str.starts_with(_OPTIMIZER_RANGES[1])))
    oe = opt["end_ns"].to_numpy()
    ko = step_of(oe)
    before = (ko >= 0) & (oe <= b0[np.maximum(ko, 0)])
    np.maximum.at(f0, ko[before], oe[before])
    mods = cpu.filter((pl.col("cat") == "python_function") & pl.col("name").str.starts_with("nn.Module: "))
    ms = mods["start_ns"].to_numpy()
    km = step_of(ms)
    km = np.where((km >= 0) & (ms >= f0[np.maximum(km, 0)]) & (ms < b0[np.maximum(km, 0)]), km, -1)
    m0 = np.full(n, np.iinfo(np.int64).max)
    np.minimum.at(m0, km[km >= 0], ms[km >= 0])
    by_module = m0 < np.iinfo(np.int64).max
    f0 = np.where(by_module, m0, f0)
    at = np.maximum(call_k, 0)
    fwbw = (call_k >= 0) & has[at] & (call_start >= f0[at]) & (call_start < b1[at])
    fwbw &= _covered(opt.select("tid", "start_ns", "end_ns"), call_tid, call_start, call_start + 1) == 0
    start = ("the first nn.Module range" if by_module[has].all() else
             "the step's start (the trace records no nn.Module ranges: its batch fetch and loss count as forward)"
             if not by_module[has].any() else "the first nn.Module range where recorded, else the step's start")
    how = (f"forward and backward: from {start}, or the optimizer's last range before the backward, to the end of "
           f"autograd's backward pass (its {_BACKWARD} ranges), the optimizer's ranges left out; "
           f"{int(has.sum())} of {n} steps show a backward")
    return fwbw, how


def _waits(op_start: np.ndarray, op_dur: np.ndarray, op_stream: np.ndarray, late: np.ndarray) -> np.ndarray:
    """For each ``late`` operation, the operation on another stream it waited for: the latest
    to end by 1 us after its start, where that end is within 50 us of it; -1 elsewhere. Per
    stream of late operations (a loop bounded by streams), the latest end among the other
    streams' found by a search."""
    op_dep = np.full(op_start.size, -1, dtype=np.int64)
    ends = op_start + op_dur
    by_end = np.argsort(ends, kind="stable")
    sorted_ends = ends[by_end]
    end_stream = op_stream[by_end]
    for s in np.unique(op_stream[late]):
        j = np.flatnonzero(late & (op_stream == s))
        other = np.flatnonzero(end_stream != s)
        r = np.searchsorted(sorted_ends, op_start[j] + 1_000, side="right") - 1
        k = np.searchsorted(other, r, side="right") - 1  # the latest other-stream end at or before r
        at = other[np.maximum(k, 0)] if other.size else np.zeros(j.size, dtype=np.int64)
        ok = (k >= 0) & (op_start[j] - sorted_ends[at] < 50_000)
        op_dep[j[ok]] = by_end[at[ok]]
    return op_dep


_DTYPE_BYTES = {"Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Int": 4, "Long": 8, "Byte": 1, "Char": 1, "Bool": 1,
                "Short": 2, "Float8_e4m3fn": 1, "Float8_e5m2": 1}


def _comm_bytes(trace, ops: pl.DataFrame) -> np.ndarray:
    """Each collective kernel's payload (bytes) from its ``record_param_comms`` metadata (the
    larger of input and output); 0 where the trace does not say."""
    out = np.zeros(ops.height, dtype=np.int64)
    comms = trace.comms
    if comms.height == 0 or not ops["is_comm"].any():
        return out
    meta = comms.unique("external_id", keep="first").select(
        "external_id", pl.max_horizontal("in_nelems", "out_nelems").alias("n"), "dtype"
    )
    got = ops.select("external_id").join(meta, on="external_id", how="left", maintain_order="left")
    size = got["dtype"].map_elements(lambda d: _DTYPE_BYTES.get(d, 0), return_dtype=pl.Int64, skip_nulls=True)
    out[:] = (got["n"].fill_null(0) * size.fill_null(0)).to_numpy()
    out[~ops["is_comm"].fill_null(False).to_numpy()] = 0
    return out


def _middle(graphs: list[StepGraph]) -> list[StepGraph]:
    """The consecutive graphs in the middle whose calls together stay within ``MAX_CALLS``
    (at least one), as a whole analysis replays the middle steps (``_choose_steps``)."""
    n = [g.n_calls for g in graphs]
    if sum(n) <= MAX_CALLS:
        return graphs
    best = (0, 1)
    for a in range(len(graphs)):
        b, total = a, 0
        while b < len(graphs) and total + n[b] <= MAX_CALLS:
            total += n[b]
            b += 1
        # the longest run, of those the nearest the middle
        key = (b - a, -abs((a + b) - len(graphs)))
        if b > a and key > (best[1] - best[0], -abs(sum(best) - len(graphs))):
            best = (a, b)
    return graphs[best[0] : best[1]]


def _covered_from(spans: pl.DataFrame, a: int, b: int) -> int:
    """The ns of [a, b) that ``spans`` (tid, start_ns, end_ns) of one thread cover."""
    return int(_covered(spans, spans["tid"].to_numpy()[:1], np.array([a]), np.array([b]))[0]) if spans.height else 0


def concat(graphs: list[StepGraph], parts: list[int] | None = None) -> StepGraph | None:
    """One step graph of a trace analysed in consecutive parts, from the parts' graphs: their
    calls and operations in order, the work before each part's first call measured from the
    part before's last (what a whole analysis replays, of the same steps). ``parts``: each
    graph's part number, where some parts' graphs were left out (``report.combine`` keeps a
    spread of them within the memory budget): a part after one left out keeps its own first
    stretch of work, measured from its own first event. Of the graphs, those in the middle
    whose calls stay within ``MAX_CALLS``, as a whole analysis bounds its replay."""
    parts = list(range(len(graphs))) if parts is None else parts
    kept = [(g, i) for g, i in zip(graphs, parts) if g is not None and g.n_calls]
    graphs = [g for g, _ in kept]
    number = {id(g): i for g, i in kept}
    if not graphs:
        return None
    device = max({g.device for g in graphs}, key=lambda d: sum(g.op_dur.sum() for g in graphs if g.device == d))
    graphs = sorted((g for g in graphs if g.device == device), key=lambda g: int(g.call_start[0]))
    graphs = _middle(graphs)
    if len(graphs) == 1:
        return dataclasses.replace(graphs[0])
    cat = lambda name: np.concatenate([getattr(g, name) for g in graphs])  # noqa: E731
    call_off = np.cumsum([0] + [g.n_calls for g in graphs[:-1]])
    op_off = np.cumsum([0] + [g.op_start.size for g in graphs[:-1]])
    work = cat("work").copy()
    events, python = cat("work_events").copy(), cat("work_python").copy()
    loader, quiet = cat("work_loader").copy(), cat("work_quiet").copy()
    # the first call, as a whole analysis replays it: no work before it, its own events
    first = graphs[0]
    if first.head is not None:
        events[0], python[0] = (h.size - np.searchsorted(h, first.call_start[0]) for h in (first.head.events, first.head.python))
        work[0] = loader[0] = quiet[0] = 0
    for g, prev, at in zip(graphs[1:], graphs[:-1], call_off[1:]):
        if number[id(g)] != number[id(prev)] + 1 or g.head is None:
            continue  # (the part before it was left out: its own first stretch stands)
        reach = int((prev.call_start + prev.call_dur).max())
        work[at] = max(int(g.call_start[0]) - reach, 0)
        # the stretch's host events: the part before's after its last call, and this part's
        # from where those end (before it, only the frames open across the cut, which the part
        # before holds); its quiet spans are this part's, which it found from the threads' ends
        # in the parts before (``observer.host_only_spans``), from that last call on
        head, tail = g.head, prev.tail
        events[at] = tail.events + head.events.size - np.searchsorted(head.events, tail.cut)
        python[at] = tail.python + head.python.size - np.searchsorted(head.python, tail.cut)
        loader[at] = min(_covered_from(head.loader, reach, int(g.call_start[0])), work[at])
        quiet[at] = min(_covered_from(head.quiet, reach, int(g.call_start[0])), work[at] - loader[at])
    op_call = np.concatenate([g.op_call + o for g, o in zip(graphs, call_off)])
    op_dep = np.concatenate([np.where(g.op_dep >= 0, g.op_dep + o, -1) for g, o in zip(graphs, op_off)])
    weights = [g.op_start.size for g in graphs]
    return StepGraph(
        device=device, steps=sorted({s for g in graphs for s in g.steps}), call_start=cat("call_start"),
        call_dur=cat("call_dur"), call_kind=cat("call_kind"), call_name=cat("call_name"), call_step=cat("call_step"),
        call_optimizer=cat("call_optimizer"), work=work, work_events=events, work_python=python,
        work_loader=loader, work_quiet=quiet, op_start=cat("op_start"), op_dur=cat("op_dur"),
        op_stream=cat("op_stream"), op_kind=cat("op_kind"), op_name=cat("op_name"), op_call=op_call, op_dep=op_dep,
        op_pageable=cat("op_pageable"), op_bytes=cat("op_bytes"), op_comm=cat("op_comm"), op_copy=cat("op_copy"),
        op_gap=cat("op_gap"), op_comm_bytes=cat("op_comm_bytes"), latency_ns=int(np.average([g.latency_ns for g in graphs], weights=weights)),
        wake_ns=int(np.average([g.wake_ns for g in graphs], weights=weights)),
        call_region=None if all(g.call_region is None for g in graphs) else np.concatenate([g.region for g in graphs]),
        call_fwbw=None if all(g.call_fwbw is None for g in graphs) else np.concatenate(
            [g.call_fwbw if g.call_fwbw is not None else np.zeros(g.n_calls, dtype=bool) for g in graphs]),
        fwbw_how=next((g.fwbw_how for g in graphs if g.call_fwbw is not None), graphs[0].fwbw_how),
    )  # fmt: skip
