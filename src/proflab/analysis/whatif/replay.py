"""Replay a step graph: the times every host call and GPU operation would have with the
durations of a :class:`Plan`, and the GPU-side step times that follow.

The host issues its calls in order, each after its stretch of work. A launch makes its
operations ready a launch latency later; an operation starts once it is ready, its stream is
free and the operation on another stream it waited for has ended. A synchronising call (and a
copy the host waits for, and a ``cudaFree``) returns once the work launched before it has
ended, a wake-up later. Step k's time is the start of step k+1's first operation minus step
k's: the step the GPU experiences, as the step table measures it, whichever side is behind.
The critical path is what this walk follows; a fix that does not shorten it gains nothing.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np

from proflab.analysis.whatif.graph import COPY, FREE, LAUNCH, SYNC, StepGraph, call_ops

# Imported by name, as the readers' compiled decoder is (a compiled module has no source for
# the layer contract to read).
try:
    _native = importlib.import_module("proflab.analysis.whatif._replay")
except ImportError:  # built without a C compiler: the walk runs in Python (the same result, slower)
    _native = None

__all__ = ["Plan", "Timeline", "replay", "SYNC_OVERHEAD_NS"]

SYNC_OVERHEAD_NS = 8_000  # a synchronising call that finds the GPU drained already
BLOCKED_FACTOR = 3.0  # a launch call this many times the median one was held up (``observer``'s rule)


@dataclass
class Plan:
    """The durations a replay uses (ns), one array per graph array; fixes edit a copy."""

    work: np.ndarray
    call_dur: np.ndarray
    call_kind: np.ndarray
    op_dur: np.ndarray
    op_alive: np.ndarray  # False: the operation no longer runs (fused into another)
    op_stream: np.ndarray
    op_dep: np.ndarray
    op_free: np.ndarray  # True: the operation's stream order is not waited on by later work (prefetched)
    loader: np.ndarray  # of ``work``, the input pipeline's (ns)
    quiet: np.ndarray  # of ``work``, the program's other work that launches nothing (ns)
    op_not_before: np.ndarray  # an operation starts no earlier (a collective waits for every rank: ``job``)

    @classmethod
    def of(cls, g: StepGraph, work: np.ndarray | None = None) -> Plan:
        # A launch call many times the median one waited on a full launch queue (or the
        # allocator): that wait is the GPU's pace, which the replay makes itself, not host work.
        launch = g.call_kind == LAUNCH
        dur = g.call_dur.astype(np.float64)
        if launch.any():
            cap = BLOCKED_FACTOR * float(np.median(dur[launch]))
            dur = np.where(launch & (dur > cap), cap, dur)
        return cls(
            work=(g.work if work is None else work).astype(np.float64),
            call_dur=dur,
            call_kind=g.call_kind.copy(),
            op_dur=g.op_dur.astype(np.float64),
            op_alive=np.ones(g.op_start.size, dtype=bool),
            op_stream=g.op_stream,  # (the graph's own: shared, read-only, as ``copy`` says)
            op_dep=g.op_dep,
            op_free=np.zeros(g.op_start.size, dtype=bool),
            loader=g.work_loader.astype(np.float64),
            quiet=g.work_quiet.astype(np.float64),
            op_not_before=np.zeros(g.op_start.size),
        )

    def copy(self) -> Plan:
        """A plan of its own arrays where fixes edit them in place; the arrays no fix edits in
        place (``_SHARED``: a fix that changes one makes a new one) shared, made read-only so
        that an edit in place fails instead of changing every plan that holds them (a report
        copies a plan for each of its replays: on a 1 GB trace's graph a whole copy took ~1 ms)."""
        for f in _SHARED:
            getattr(self, f).setflags(write=False)
        return Plan(*(getattr(self, f) if f in _SHARED else getattr(self, f).copy() for f in self.__dataclass_fields__))


_SHARED = ("op_stream", "op_dep", "op_free", "loader", "quiet", "op_not_before")


@dataclass
class Timeline:
    """A replay's result: new call starts and operation starts/ends (ns, from the first call),
    and the GPU-side time of each step that has a next one (ms)."""

    call_start: np.ndarray
    op_start: np.ndarray
    op_end: np.ndarray
    step_ms: dict[int, float]
    op_ready: np.ndarray | None = None  # when each operation could have started but for ``op_not_before``

    @property
    def median_step_ms(self) -> float | None:
        v = sorted(self.step_ms.values())
        return v[len(v) // 2] if v else None


def replay(g: StepGraph, p: Plan) -> Timeline:
    """``g`` walked with the durations of ``p`` (the compiled walk where it was built, else
    the same walk in Python: they give the same floats, bit for bit)."""
    n, m = g.n_calls, g.op_start.size
    call_start = np.zeros(n)
    op_start = np.full(m, np.nan)
    op_end = np.full(m, np.nan)
    op_ready = np.full(m, np.nan)
    if _native is not None:
        ptr, ops = call_ops(g)
        n_streams, stream_ix = _stream_index(g, p.op_stream)
        _native.walk(
            _f64(p.work), _f64(p.call_dur), np.ascontiguousarray(p.call_kind, dtype=np.int8), ptr, ops, _f64(p.op_dur),
            np.ascontiguousarray(p.op_alive, dtype=bool), stream_ix, n_streams,
            np.ascontiguousarray(p.op_dep, dtype=np.int64), np.ascontiguousarray(p.op_free, dtype=bool), _f64(p.op_not_before),
            _f64(g.op_gap), float(g.latency_ns), float(g.wake_ns), float(SYNC_OVERHEAD_NS), (LAUNCH, SYNC, COPY, FREE),
            call_start, op_start, op_end, op_ready,
        )  # fmt: skip
    else:
        _walk_py(g, p, call_start, op_start, op_end, op_ready)
    return Timeline(call_start, op_start, op_end, _step_ms(g, p, op_start), op_ready)


def _stream_index(g: StepGraph, op_stream: np.ndarray) -> tuple[int, np.ndarray]:
    """The streams as dense indices for the compiled walk: the graph's own made once (a sort
    of every operation, which per replay cost more than the walk), a plan's that moved some
    operations (``prefetch_copies``) made again."""
    got = g.__dict__.get("_stream_index")
    if got is None:
        streams, ix = np.unique(g.op_stream, return_inverse=True)
        got = g.__dict__["_stream_index"] = (int(streams.size), ix.astype(np.int64).reshape(-1))
    if op_stream is g.op_stream or np.array_equal(op_stream, g.op_stream):
        return got
    streams, ix = np.unique(op_stream, return_inverse=True)
    return int(streams.size), ix.astype(np.int64).reshape(-1)


def _f64(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float64)


def _walk_py(g: StepGraph, p: Plan, call_start, op_start, op_end, op_ready) -> None:
    """The walk (the module doc), filling the arrays given: the compiled one's reference, and
    what runs where it was not built."""
    not_before = p.op_not_before
    stream_end: dict[int, float] = {}
    launched_end = 0.0  # the latest end of the work launched so far (what a sync waits for)
    lat, wake = float(g.latency_ns), float(g.wake_ns)
    t = 0.0
    work, call_dur, kind = p.work, p.call_dur, p.call_kind
    op_dur, alive, streams, deps, free = p.op_dur, p.op_alive, p.op_stream, p.op_dep, p.op_free
    ptr, ops = call_ops(g)
    for i in range(g.n_calls):
        t += work[i]
        cs = t
        call_start[i] = cs
        k = kind[i]
        if k == LAUNCH or k == COPY:
            last = cs
            gap = g.op_gap
            for j in ops[ptr[i] : ptr[i + 1]]:
                if not alive[j]:
                    continue
                s = streams[j]
                start = max(cs + lat, stream_end.get(s, 0.0) + gap[j])
                d = deps[j]
                if d >= 0 and not np.isnan(op_end[d]):
                    start = max(start, op_end[d])
                op_ready[j] = start
                start = max(start, not_before[j])
                end = start + op_dur[j]
                op_start[j], op_end[j] = start, end
                if not free[j]:
                    stream_end[s] = end
                    launched_end = max(launched_end, end)
                last = max(last, end)
            t = max(cs + call_dur[i], last + wake) if k == COPY else cs + call_dur[i]
        elif k == SYNC or k == FREE:
            t = max(cs + min(call_dur[i], SYNC_OVERHEAD_NS), launched_end + wake)
        else:
            t = cs + call_dur[i]


def _step_ms(g: StepGraph, p: Plan, op_start: np.ndarray) -> dict[int, float]:
    """Per step that has a next one: the start of the next step's first operation minus its own."""
    order, starts, index = _step_groups(g)
    lowest = np.full(len(g.steps), np.inf)
    if starts.size:
        # (an operation that did not run, NaN, never the lowest; ufunc.at was 100x slower before numpy 1.25)
        v = op_start[order]
        lowest[index] = np.minimum.reduceat(np.where(np.isnan(v), np.inf, v), starts)
    first = {s: float(v) for s, v in zip(g.steps, lowest.tolist()) if v != np.inf}
    out = {}
    for a, b in zip(g.steps[:-1], g.steps[1:]):
        if a in first and b in first:
            out[a] = (first[b] - first[a]) / 1e6
    return out


def _step_groups(g: StepGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The operations of the analysed steps grouped by step (their indices, each group's first
    position in them, and its step's index in ``g.steps``), made once a graph."""
    got = g.__dict__.get("_step_groups")
    if got is None:
        step_of_op = g.call_step[g.op_call].astype(np.int64)
        at = np.full(step_of_op.size, -1, dtype=np.int64)  # each operation's step's index in g.steps
        if g.steps:
            steps = np.asarray(g.steps, dtype=np.int64)
            by = np.argsort(steps, kind="stable")
            k = np.clip(np.searchsorted(steps[by], step_of_op), 0, steps.size - 1)
            hit = steps[by][k] == step_of_op
            at[hit] = by[k[hit]]
        order = np.flatnonzero(at >= 0)
        order = order[np.argsort(at[order], kind="stable")]
        index, starts = np.unique(at[order], return_index=True)
        got = g.__dict__["_step_groups"] = (order, starts, index)
    return got


def observed_step_ms(g: StepGraph) -> dict[int, float]:
    """The same step times from the trace's own timings (what a replay of them must give back)."""
    first: dict[int, float] = {}
    step_of_op = g.call_step[g.op_call]
    for s in g.steps:
        sel = step_of_op == s
        if sel.any():
            first[s] = float(g.op_start[sel].min())
    return {a: (first[b] - first[a]) / 1e6 for a, b in zip(g.steps[:-1], g.steps[1:]) if a in first and b in first}


