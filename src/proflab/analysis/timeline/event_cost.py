"""What one recorded event cost the profiled host, measured from the trace itself.

torch.profiler's cost is its callbacks: one as an operator (or runtime call) starts, one as it
ends. Each callback's work falls partly outside the event's recorded span and partly inside it,
and the trace shows both parts where nothing else runs:

``gap``     between two operators one C++ operator calls in turn (``aten::linear``'s
            ``aten::t`` ending and its ``aten::addmm`` starting) no Python runs and the C++
            between two calls is tens of nanoseconds: the gap is the first event's end callback
            and the second's start callback, the part outside.
``inside``  an operator that does no work of its own (a view: ``aten::view``,
            ``aten::as_strided``, ... with no child) lasts what its callbacks spend between its
            two timestamps, the part inside.

One event's cost is then its gap plus its inside. Both spread with a long upper tail (a
callback that records more inputs' shapes, or allocates, takes longer), and what the profiler
adds to a token is their *sum* over the token's events: the per-event cost is the gaps' mean
plus the insides' mean, not the usual event's (their medians). Its range runs from the usual
event's cost (the medians' sum: as if the gaps' tail below the cap were the program's work) to
the means' sum (all of it the callbacks'), which the unprofiled latency takes
(``inference._unprofiled``). Measured on the H100 generate() sets, recorded with CUPTI torn
down after each profiled run (``tests/data/inference/h100`` and ``h100-rounds``): gaps median
1.1-1.3 us, mean 1.9-2.4; views median 0.45-0.55, mean 0.7-0.9; the bare runs put 2.2-3.1 us
on each event of an eager decode (the profiled inter-token time less the bare one, over the
events of a token), where the means sum to 2.6-3.3 and the medians to 1.5-1.9. (An earlier recording,
its bare rounds timed after a profiled run had left CUPTI attached, put 1.5-1.9 us on an event,
and the medians were used.) The observer model's fixed range (``observer.EVENT_COST_US``: 2-9
us, from loops recorded on other machines and PyTorch versions) stays where the trace cannot
say: fewer than ``MIN_PAIRS`` gaps (a trace without nested operators, an nsys export). The
analysis asks for the measurement only of a generation loop (``Context.event_cost``): on the
training loops of tests/data/realistic, recorded on an H200, the same gaps put 2.3-4.9 us on an
event where those loops' measured host time says less.

Only the thread that records the most operators is read, its first ``MAX_EVENTS`` host
events: quartiles of thousands of gaps do not move with more, and a 10 M event trace costs
the same as a small one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from proflab.analysis.timeline.observer import EVENT_COST_US
from proflab.model import Trace

__all__ = ["EventCost", "Startup", "measure", "startup", "combined", "cost_at", "DEFAULT"]

MIN_PAIRS = 200  # gaps below which the trace's measurement is not used
MAX_EVENTS = 100_000  # host events of the hot thread read
_GAP_CAP_NS = 50_000  # a gap this long is work between the calls (an allocation, a sync), not callbacks
_EVENTS = ("cpu_op", "cuda_runtime", "cuda_driver", "user_annotation")
# operators that only make a tensor view or an empty tensor: their recorded time is the profiler's
_NO_WORK = ("aten::view", "aten::as_strided", "aten::_reshape_alias", "aten::alias", "aten::unsqueeze",
            "aten::squeeze", "aten::slice", "aten::select", "aten::expand", "aten::detach",
            "aten::_unsafe_view", "aten::resolve_conj", "aten::resolve_neg", "aten::empty")


@dataclass(frozen=True)
class EventCost:
    """The profiler's cost per recorded host event (us): ``lo_us`` to ``hi_us``. ``source`` is
    ``measured`` (from this trace: ``gap_us`` and ``inside_us`` are the medians it read, over
    ``pairs`` gaps, ``gap_mean_us`` and ``inside_mean_us`` the means) or ``default`` (the
    observer model's range)."""

    lo_us: float
    hi_us: float
    source: str
    gap_us: float | None = None
    inside_us: float | None = None
    pairs: int = 0
    gap_mean_us: float | None = None
    inside_mean_us: float | None = None

    def at(self, end: int) -> float:
        """The cost at the range's low (0) or high (1) end."""
        return self.hi_us if end else self.lo_us

    @property
    def central_at(self) -> float:
        """Where in the range the estimate takes the cost (``cost_at``): a measured cost at its
        high end, the means' sum (what the events cost together); the model's range at its middle."""
        return 1.0 if self.source == "measured" else 0.5

    def to_dict(self) -> dict:
        d = {"per_event_cost_us": [round(self.lo_us, 2), round(self.hi_us, 2)], "source": self.source}
        if self.source == "measured":
            d.update(gap_median_us=round(self.gap_us, 2), no_work_operator_median_us=round(self.inside_us, 2),
                     gaps=self.pairs)
            if self.gap_mean_us is not None:
                d.update(gap_mean_us=round(self.gap_mean_us, 2), no_work_operator_mean_us=round(self.inside_mean_us, 2))
        return d


DEFAULT = EventCost(*EVENT_COST_US, source="default")


def measure(trace: Trace) -> EventCost:
    """The per-event cost this trace's profiler spent (see the module doc); ``DEFAULT`` where
    the trace holds too few gaps to say."""
    cpu = trace.cpu
    if cpu.height == 0 or "tid" not in cpu.columns:
        return DEFAULT
    hosts = cpu.lazy().filter(pl.col("cat").is_in(_EVENTS) & pl.col("tid").is_not_null())
    ops = hosts.filter(pl.col("cat") == "cpu_op").group_by("tid").len().sort("len", "tid", descending=[True, False]).collect()
    if ops.height == 0:
        return DEFAULT
    hot = ops["tid"][0]
    ev = (hosts.filter(pl.col("tid") == hot).head(MAX_EVENTS)
          .select("start_ns", "dur_ns", (pl.col("cat") == "cpu_op").alias("op"), pl.col("name").is_in(_NO_WORK).alias("view"))
          .collect())  # fmt: skip
    s = ev["start_ns"].to_numpy()
    order = np.argsort(s, kind="stable")  # (the host table is in start order: a no-op there)
    s = s[order]
    e = s + ev["dur_ns"].to_numpy()[order]
    op, view = ev["op"].to_numpy()[order], ev["view"].to_numpy()[order]
    if s.size < 3:
        return DEFAULT
    pairs = _sibling_gaps(s, e, op)
    childless = np.append(s[1:] >= e[:-1], True)  # the next event starts after it ends
    inside = (e - s)[view & childless & op]
    if pairs.size < MIN_PAIRS or inside.size == 0:
        return DEFAULT
    gap, gap_mean = float(np.median(pairs)) / 1e3, float(pairs.mean()) / 1e3
    mid, mid_mean = float(np.median(inside)) / 1e3, float(inside.mean()) / 1e3
    usual, mean = gap + mid, gap_mean + mid_mean
    return EventCost(lo_us=usual, hi_us=mean, source="measured", gap_us=gap, inside_us=mid,
                     pairs=int(pairs.size), gap_mean_us=gap_mean, inside_mean_us=mid_mean)


@dataclass(frozen=True)
class Startup:
    """The profiler's one-off cost on the first CUDA call it traced: the operator around that call
    (``op``, starting at ``at_ns``) took ``excess_ns`` longer than the median of its later calls of
    the same shapes (``later``)."""

    at_ns: int
    excess_ns: int
    op: str
    later: int

    def to_dict(self) -> dict:
        return {"operator": self.op, "excess_us": round(self.excess_ns / 1e3, 1), "compared_with": self.later}


MIN_LATER = 3  # later calls of the operator below which its first call's excess is not measured


def startup(trace: Trace) -> Startup | None:
    """The profiler's start-up cost, measured where the trace shows it: CUPTI sets itself up on the
    first CUDA API call it traces, inside the operator that makes it. On the H100 generate() set
    (``tests/data/inference/h100``) ``generate``'s first operator, a scalar's host-to-device copy
    (``aten::copy_``, ~20-60 us later in the same trace), took 0.39-2.38 ms longer than its later
    calls: the profiled prefill took longer than a decode forward of as many events, where the
    bare runs' first token took about as long as the next ones.
    The excess is the innermost operator around the trace's first runtime call less the median
    of that operator's later calls with the same input shapes (of the same name where fewer than
    ``MIN_LATER`` share them). None where the trace has no such call or the first call was not
    slower."""
    cpu = trace.cpu
    if cpu.height == 0 or "tid" not in cpu.columns:
        return None
    rt = cpu.lazy().filter(pl.col("cat") == "cuda_runtime").select("tid", "start_ns").head(1).collect()
    if rt.height == 0:
        return None
    tid, t = rt["tid"][0], rt["start_ns"][0]
    dims = "input_dims" in cpu.columns
    ops = (cpu.lazy().filter((pl.col("cat") == "cpu_op") & (pl.col("tid") == tid))
           .select("name", "start_ns", "dur_ns", pl.col("input_dims") if dims else pl.lit(None, pl.String).alias("input_dims"))
           .collect())  # fmt: skip
    around = ops.filter((pl.col("start_ns") <= t) & (pl.col("start_ns") + pl.col("dur_ns") >= t))
    if around.height == 0:
        return None
    first = around.sort("start_ns").row(-1, named=True)  # the innermost: the last to start
    later = ops.filter((pl.col("name") == first["name"]) & (pl.col("start_ns") > first["start_ns"]))
    same = later.filter(pl.col("input_dims") == first["input_dims"]) if first["input_dims"] is not None else later.clear()
    pool = same if same.height >= MIN_LATER else later
    if pool.height < MIN_LATER:
        return None
    excess = int(first["dur_ns"] - float(pool["dur_ns"].median()))
    return Startup(at_ns=int(first["start_ns"]), excess_ns=excess, op=first["name"], later=pool.height) if excess > 0 else None


def _sibling_gaps(s: np.ndarray, e: np.ndarray, op: np.ndarray) -> np.ndarray:
    """The gaps (ns) between each event and the sibling before it (the event at its depth that
    ended last before it started), where their parent is an operator (no Python runs between
    two calls of C++) and the gap is below _GAP_CAP_NS. Events of one thread in start order,
    nested as a thread's are: an event's depth is the events started before it less those
    ended by its start; it has a sibling before it where the event just before it in start order
    is at its depth or deeper (else that event is its parent); that sibling is the event at its
    depth just before it. A loop over depths, not events."""
    k = np.arange(s.size)
    depth = np.maximum(k - np.searchsorted(np.sort(e), s, side="right"), 0)
    has_sibling = np.zeros(s.size, dtype=bool)
    has_sibling[1:] = (depth[:-1] >= depth[1:]) & (depth[1:] >= 1)
    by_depth = np.lexsort((k, depth))  # each depth's events in start order
    prev = np.empty(s.size, dtype=np.int64)
    prev[by_depth[1:]] = by_depth[:-1]
    prev[by_depth[0]] = -1
    in_op = np.zeros(s.size, dtype=bool)  # the parent is an operator
    for d in range(1, int(depth.max()) + 1):
        at_d = np.flatnonzero(depth == d)
        parents = np.flatnonzero(depth == d - 1)
        if at_d.size and parents.size:
            p = parents[np.maximum(np.searchsorted(parents, at_d) - 1, 0)]
            in_op[at_d] = op[p] & (p < at_d)
    ok = has_sibling & in_op & (prev >= 0) & (depth[np.maximum(prev, 0)] == depth)
    gaps = s[ok] - e[prev[ok]]
    return gaps[(gaps >= 0) & (gaps < _GAP_CAP_NS)]


def combined(costs: list[EventCost]) -> EventCost:
    """One trace's cost from its parts' (a trace analysed in parts): the median of the ends the
    parts measured, their gaps summed; ``DEFAULT`` where none measured."""
    got = [c for c in costs if c.source == "measured"]
    if not got:
        return DEFAULT
    med = lambda xs: float(np.median(xs))  # noqa: E731
    means = [c for c in got if c.gap_mean_us is not None]
    return EventCost(lo_us=med([c.lo_us for c in got]), hi_us=med([c.hi_us for c in got]), source="measured",
                     gap_us=med([c.gap_us for c in got]), inside_us=med([c.inside_us for c in got]),
                     pairs=sum(c.pairs for c in got), gap_mean_us=med([c.gap_mean_us for c in means]) if means else None,
                     inside_mean_us=med([c.inside_mean_us for c in means]) if means else None)


def cost_at(bounds: tuple[float, float], alpha: float) -> float:
    """The per-event cost at ``alpha`` of its range (0: the low end, 1: the high end), on a log
    scale: the range spans 25x for Python frames (0.2-5 us), and its middle, 1 us, is what a
    rerun measured (0.2-1 us a frame, tests/data/realistic/rerun)."""
    lo, hi = bounds
    return lo * (hi / lo) ** alpha
