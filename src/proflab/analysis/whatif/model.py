"""The what-if model of one trace: the bare step replayed, and what each fix saves.

A finding's gain is a prediction of the *bare* step time its fix saves. The trace is a
profiled run, so the step graph (``graph``) first loses the profiler's own cost: each stretch
of host work gives back its recorded events times a per-event cost, never below what an
unprofiled eager step costs (``observer``'s figures; the work that launches nothing is real
and keeps its time). Where the unprofiled step was measured (``proflab run`` times the steps
outside its window; ``--bare-step-ms``), the per-event cost is the one at which the replayed
step meets it (within ``observer``'s range; where the measured step is longer than any cost
replays, the trace lacks time the bare loop spends: the cost stays at the middle of the range
and that time, ``unplaced_ms``, is added as host work at each step's start, which no fix
removes);
otherwise the middle of the per-event cost's range (for a generation loop the one its trace shows,
``event_cost``: the gaps the profiler's callbacks leave between nested operators; elsewhere the
model's), and the prediction carries the range the two ends give.

A prediction replays that bare plan before and after the fix (``fixes``), and takes the
difference of the median replayed steps: the critical path decides, so a fix that does not
shorten it gains nothing, and no combination of fixes saves more than the GPU work that is
left allows. Where the step was measured, the prediction is anchored to it: after = measured
- gain.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from proflab._timings import phase
from proflab.analysis.timeline.event_cost import cost_at
from proflab.analysis.timeline.observer import EVENT_COST_US, FLOOR_LAUNCH_US, PYTHON_COST_US
from proflab.analysis.whatif.fixes import RANGED, Fix, apply
from proflab.analysis.whatif.graph import LAUNCH, StepGraph, build_graph, kept
from proflab.analysis.whatif.replay import Plan, observed_step_ms, replay

__all__ = ["WhatIf", "Prediction", "StepSaving", "replay_cost_us", "replay_central_at"]

# fixes of host time whose size is what the profiler's cost leaves of it: dispatch, and the
# program's own Python (whose frames with_stack records)
_HOST_FIXES = ("compile", "cuda_graph", "fuse_optimizer", "remove_host_work")
_LAUNCH_FLOOR_NS = 2_000  # a launch call without the profiler's callback
_FLOOR_EVENT_NS = 500  # an operator nested in another costs less unprofiled than the observer's 1 us a top-level one


class StepSaving:
    """A bare step before and after fixes (``before_ms``, ``after_ms``, ``gain_ms``, ``source``):
    the figures every prediction states, in one wording (the renderers read these keys)."""

    before_ms: float
    after_ms: float
    gain_ms: float
    source: str

    @property
    def gain_pct(self) -> float:
        return round(100.0 * self.gain_ms / self.before_ms, 2) if self.before_ms > 0 else 0.0

    def saving(self) -> dict:
        return {
            "bare_step_ms": round(self.before_ms, 3),
            "bare_step_source": self.source,
            "predicted_step_ms": round(self.after_ms, 3),
            "predicted_gain_ms": round(self.gain_ms, 3),
            "predicted_gain_pct": self.gain_pct,
        }


@dataclass(frozen=True)
class Prediction(StepSaving):
    """What a set of fixes saves per bare step (ms), and from what."""

    fixes: tuple[Fix, ...]
    before_ms: float  # the bare step (measured where known, else the replay's)
    after_ms: float
    gain_ms: float
    gain_range_ms: tuple[float, float]  # at the low and high end of the profiler's cost (equal where measured)
    replayed_before_ms: float
    gpu_work_after_ms: float  # the GPU work left per step: no fix saves past it
    source: str  # "measured" | "estimated": where the bare step came from
    # without a measured step, what a fix of host time keeps at the fastest plausible bare step
    # (the cap in ``WhatIf._replayed``); the finding's severity follows it (``severity_pct``)
    held_gain_ms: float | None = None

    @property
    def severity_pct(self) -> float:
        """The share of the step a severity is judged on: the gain that holds at the fastest
        plausible bare step where one was estimated, else the gain."""
        held = self.gain_ms if self.held_gain_ms is None else self.held_gain_ms
        return round(100.0 * held / self.before_ms, 2) if self.before_ms > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "model": "replay",
            "fixes": [f.label or f.kind for f in self.fixes],
            **self.saving(),
            "predicted_gain_range_ms": [round(x, 3) for x in self.gain_range_ms],
            **({} if self.held_gain_ms is None else {"held_gain_ms": round(self.held_gain_ms, 3)}),
            "replayed_bare_step_ms": round(self.replayed_before_ms, 3),
            "gpu_work_after_ms": round(self.gpu_work_after_ms, 3),
            "assumptions": [f.assumption for f in self.fixes],
        }


@dataclass
class WhatIf:
    """Built once per analysis context (``Context.whatif``); None-safe: ``available`` says
    whether the trace gives a step graph, ``why_not`` why it does not."""

    graph: StepGraph | None
    bare_step_ms: float | None
    why_not: str | None = None
    observed_bare_lo_ms: float | None = None  # the observer's fastest plausible unprofiled step (estimated)
    event_cost_us: tuple[float, float] = EVENT_COST_US  # the profiler's cost per event, low and high (``ctx.event_cost``)
    central_at: float = 0.5  # where in that range the cost is taken without a measured step (``replay_central_at``)
    _alpha: float = 0.5
    _calibration: dict = field(default_factory=dict)
    _unplaced_ns: float = 0.0
    _step_starts: np.ndarray | None = None
    _bases: dict = field(default_factory=dict)  # alpha -> (bare plan, its replayed step): after calibration, fixed
    _base_steps: dict = field(default_factory=dict)  # alpha -> the bare plan's replayed step times (ms, by step)
    # (fixes, alpha, bare step) -> its Prediction: the rules, the overlaps and the combined
    # prediction ask for some of the same fixes
    _predicted: dict = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def of(cls, trace, ctx) -> WhatIf:
        part = ctx.part_digest is not None
        g = build_graph(trace, ctx, min_steps=1 if part else 2)
        if part:  # the combined report replays all parts' graphs as one (``report.combine``)
            ctx.part_digest["whatif_graph"] = None if g is None else kept(g)
        if g is None:
            why = ("no host launch calls tied to the GPU work" if not ctx.has_launch_links
                   else "fewer than two GPU-side profiler steps")  # fmt: skip
            return cls(None, ctx.bare_step_ms, why_not=why)
        obs = ctx.observer
        return cls.of_graph(g, ctx.bare_step_ms, obs.unprofiled_step_ms[0] if obs is not None else None,
                            replay_cost_us(ctx.event_cost, ctx.bare_step_ms),
                            replay_central_at(ctx.event_cost, ctx.bare_step_ms))  # fmt: skip

    @classmethod
    def of_graph(cls, g: StepGraph | None, bare_step_ms: float | None, observed_bare_lo_ms: float | None = None,
                 event_cost_us: tuple[float, float] = EVENT_COST_US, central_at: float = 0.5) -> WhatIf:
        """The model of a step graph already built (a trace analysed in parts: their graphs
        concatenated, ``graph.concat``)."""
        if g is None:
            return cls(None, bare_step_ms, why_not="no part holds a GPU-side profiler step")
        w = cls(g, bare_step_ms, observed_bare_lo_ms=observed_bare_lo_ms, event_cost_us=event_cost_us,
                central_at=central_at)
        w._calibrate()
        return w

    @property
    def available(self) -> bool:
        return self.graph is not None

    # -- the bare plan ---------------------------------------------------------------------
    def bare_plan(self, alpha: float | None = None) -> Plan:
        """The trace's plan without the profiler's cost: ``alpha`` 0 takes the low end of the
        per-event cost off, 1 the high end."""
        g = self.graph
        a = self._alpha if alpha is None else alpha
        ev_us, py_us = cost_at(self.event_cost_us, a), cost_at(PYTHON_COST_US, a)
        cost = g.work_events * ev_us * 1e3 + g.work_python * py_us * 1e3
        loader = g.work_loader.astype(np.float64)
        quiet = g.work_quiet.astype(np.float64)
        dispatch = np.maximum(g.work - loader - quiet, 0).astype(np.float64)
        floor = g.work_events * _FLOOR_EVENT_NS + (g.call_kind == LAUNCH) * FLOOR_LAUNCH_US * 1e3
        taken = np.minimum(cost, np.maximum(dispatch - floor, 0))
        # Python frames the profiler recorded (with_stack) cost it time in the program's own
        # Python too: what dispatch could not give back comes off that work
        from_quiet = np.minimum(np.maximum(np.minimum(g.work_python * py_us * 1e3, cost) - taken, 0), quiet)
        taken = taken + from_quiet
        # the input pipeline's own operators (a transform's tensor ops on the host) are recorded
        # events too: what the dispatch could not give back comes off the loader's work
        from_loader = np.minimum(np.maximum(cost - taken, 0), loader)
        taken = taken + from_loader
        p = Plan.of(g, loader + quiet + dispatch - taken)
        p.quiet = quiet - from_quiet
        p.loader = loader - from_loader
        if self._unplaced_ns > 0:  # time the measured step holds and the replay does not: at each step's start
            p.work[self._step_starts] += self._unplaced_ns
        # what the work could not give back comes off the launch calls, down to a bare launch
        rest = cost - taken
        launch = g.call_kind == LAUNCH
        p.call_dur = np.where(launch, np.maximum(p.call_dur - rest, np.minimum(p.call_dur, _LAUNCH_FLOOR_NS)), p.call_dur)
        return p

    def _fastest_bare_ms(self) -> float | None:
        """The fastest plausible unprofiled step (ms) where none was measured: the longer of
        the observer's (``observed_bare_lo_ms``) and the bare plan's replayed at the largest
        per-event cost, which keeps the trace's dependencies (a sync between the host's work
        and the GPU's)."""
        replayed = self._base(1.0)[1] if self.graph is not None else None
        known = [x for x in (self.observed_bare_lo_ms, replayed) if x is not None]
        return max(known) if known else None

    def _base(self, alpha: float) -> tuple[Plan, float]:
        """The bare plan at ``alpha`` and its replayed step (ms), made once: every prediction
        replays its fixes against it (a report makes dozens)."""
        if alpha not in self._bases:
            base = self.bare_plan(alpha)
            t = replay(self.graph, base)
            self._bases[alpha] = (base, t.median_step_ms or 0.0)
            self._base_steps[alpha] = t.step_ms
        return self._bases[alpha]

    def _median(self, plan: Plan) -> float:
        return replay(self.graph, plan).median_step_ms or 0.0

    @property
    def per_event_cost_us(self) -> float:
        """The profiler's cost per recorded event the bare plan takes off (us)."""
        return cost_at(self.event_cost_us, self._alpha)

    def bare_step_times(self) -> dict[int, float]:
        """Each step's time (ms) in the replay of the bare plan the predictions start from (at
        the per-event cost the calibration settled on): from its first operation's start to the
        next step's, so the last step has none."""
        self._base(self._alpha)
        return self._base_steps[self._alpha]

    def _calibrate(self) -> None:
        g = self.graph
        obs = observed_step_ms(g)
        self._calibration = {
            "observed_step_ms": _median_of(obs),
            "replayed_profiled_step_ms": self._median(Plan.of(g)),
        }
        lo, hi = self._median(self.bare_plan(0.0)), self._median(self.bare_plan(1.0))
        self._calibration["bare_replay_range_ms"] = (hi, lo)
        if self.bare_step_ms is None:
            self._alpha = self.central_at
            return
        target = self.bare_step_ms
        if target <= hi:
            self._alpha = 1.0  # the replay cannot get as fast as measured: the most cost off
        elif target >= lo:
            # The measured step is longer than any per-event cost in the range replays: the
            # trace lacks time the bare loop spends (Python it does not record, a slower
            # unprofiled path). The cost stays at the middle of its range and that time is
            # added as host work at each step's start, which no fix removes (a fix that
            # removes the host's dispatch leaves it; the GPU's tail can overlap it).
            self._alpha = 0.5
            self._step_starts = np.array([np.flatnonzero(g.call_step == st)[0] for st in g.steps if (g.call_step == st).any()])
            for _ in range(4):
                self._unplaced_ns += max(target - self._median(self.bare_plan()), 0.0) * 1e6
            self._calibration["unplaced_ms"] = round(self._unplaced_ns / 1e6, 3)
        else:  # the replayed step falls as the cost taken off rises: bisect
            a, b = 0.0, 1.0
            for _ in range(12):
                mid = (a + b) / 2
                if self._median(self.bare_plan(mid)) > target:
                    a = mid
                else:
                    b = mid
            self._alpha = (a + b) / 2
        self._calibration["per_event_cost_us"] = round(cost_at(self.event_cost_us, self._alpha), 2)

    @property
    def calibration(self) -> dict:
        """How the replay meets the trace: the observed and replayed profiled step, the bare
        replay's range, and the per-event cost it settled on (ms, us)."""
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self._calibration.items()}

    # -- predictions -------------------------------------------------------------------------
    def predict(self, *fixes: Fix) -> Prediction | None:
        """The bare step saved by making ``fixes`` together; None without a step graph."""
        if self.graph is None:
            return None
        with phase("what-if"):
            return self._predict(fixes)

    def predict_at(self, *fixes: Fix) -> Prediction | None:
        """The bare step saved by ``fixes`` exactly as given: a ranged fix at the factor it carries,
        a CUDA graph over its own target (``predict`` spans a ranged fix's factors and widens a
        forward-and-backward graph to the whole step; a caller that builds a range of its own
        from a few points asks for each here). None without a step graph."""
        if self.graph is None:
            return None
        with phase("what-if"):
            return self._predict_one(tuple(fixes))

    def _predict(self, fixes: tuple[Fix, ...]) -> Prediction:
        """The prediction of ``fixes``; a CUDA graph of the forward and backward
        (``cuda_graph``, target ``forward_backward``) at that end, its range reaching up to what
        capturing the whole step replays: the mode that captures the compiled model leaves the
        rest of the step eager, and a manual capture of the step takes it too."""
        p = self._predict_ranged(fixes)
        whole = tuple(dataclasses.replace(f, target="") if (f.kind, f.target) == ("cuda_graph", "forward_backward") else f
                      for f in fixes)  # fmt: skip
        if whole == tuple(fixes):
            return p
        up = self._predict_ranged(whole)
        return dataclasses.replace(p, gain_range_ms=(p.gain_range_ms[0], max(p.gain_range_ms[1], up.gain_range_ms[1])))

    def _predict_ranged(self, fixes: tuple[Fix, ...]) -> Prediction:
        """The prediction at the middle of each ranged fix (``fixes.RANGED``: ``factor`` 0.5),
        its range widened to what the ranges' ends replay."""
        if not any(f.kind in RANGED for f in fixes):
            return self._predict_one(fixes)
        at = lambda x: tuple(dataclasses.replace(f, factor=x) if f.kind in RANGED else f for f in fixes)  # noqa: E731
        mid, best, worst = self._predict_one(at(0.5)), self._predict_one(at(0.0)), self._predict_one(at(1.0))
        rng = (min(mid.gain_range_ms[0], worst.gain_range_ms[0]), max(mid.gain_range_ms[1], best.gain_range_ms[1]))
        return dataclasses.replace(mid, fixes=tuple(fixes), gain_range_ms=rng)

    def _predict_one(self, fixes: tuple[Fix, ...]) -> Prediction:
        key = (fixes, self._alpha, self.bare_step_ms)
        got = self._predicted.get(key)
        if got is None:
            got = self._predicted[key] = self._replayed(fixes)
        return got

    def _replayed(self, fixes: tuple[Fix, ...]) -> Prediction:
        g = self.graph
        gains = []
        replayed = work_after = None
        # (the settled cost first; at an end of the range, that end once)
        for alpha in (self._alpha,) if self.bare_step_ms is not None else dict.fromkeys((self._alpha, 0.0, 1.0)):
            base, before = self._base(alpha)
            t = replay(g, apply(g, base, *fixes))  # (a copy: the cached base stays as it was)
            gains.append(max(before - (t.median_step_ms or 0.0), 0.0))
            if replayed is None:
                replayed, work_after = before, _busy_ms(g, t)
        measured = self.bare_step_ms
        before = measured if measured is not None else replayed
        # No fix saves past the GPU work left: below the measured step; where none was
        # measured, a fix of host time (whose gain is what the profiler's cost leaves of it)
        # below the observer's fastest plausible unprofiled step, so that a host-side verdict
        # survives the largest plausible profiler cost as the observer's own does. Where the
        # fixes only take work that launches nothing off the loop, the replay's step at the
        # largest cost bounds it too: the observer's, max(GPU work, host work), lets the GPU's
        # work overlap the host's, which a sync between them forbids (20 ms of Python a step
        # before a synchronised step kept 17.3 ms of its 19.8 ms idle a step; the fix
        # measured 20.4 ms saved). Dispatch is the profiler's to inflate, and the observer's
        # bound stays for fixes of it (a GPU-bound compiled LM looked launch-bound in the
        # replay at any cost).
        host = any(f.kind in _HOST_FIXES for f in fixes)
        quiet_only = all(f.kind == "remove_host_work" for f in fixes)
        ref = measured if measured is not None else (
            (self._fastest_bare_ms() if quiet_only else self.observed_bare_lo_ms) if host else None)
        uncapped = list(gains)
        if ref is not None:
            gains = [min(x, max(ref - work_after, 0.0)) for x in gains]
        held = None
        if measured is not None:
            gain, rng = min(gains[0], before), (gains[0], gains[0])
        else:
            # no measured step: the replay at the middle of the profiler's cost range, from the
            # same bare step it starts from (``before``, the report's); the range the whole cost
            # range gives, its low end capped as above and its high end not; and what the cap
            # holds at the middle, which the severity follows, so that a verdict survives the
            # largest plausible cost (the point held there had mixed two bare steps: hf_llama's
            # compile under the Trainer, 38.17 ms estimated, was claimed 5.18 ms: the observer's
            # fastest 21.12 ms less the 15.94 ms of GPU work left; the replay's own 15.37 ms
            # against 19.36 measured)
            gain, held = min(uncapped[0], before), min(gains[0], before)
            rng = (min(gains), min(max(uncapped), before))
        return Prediction(
            fixes=tuple(fixes), before_ms=before, after_ms=before - gain, gain_ms=gain, gain_range_ms=rng,
            replayed_before_ms=replayed, gpu_work_after_ms=work_after,
            source="measured" if measured is not None else "estimated", held_gain_ms=held,
        )  # fmt: skip


def replay_cost_us(cost, bare_step_ms: float | None) -> tuple[float, float]:
    """The per-event cost range the bare plan is replayed over: the trace's own (``cost``,
    ``event_cost.EventCost``) where no unprofiled step was measured; where one was, the model's
    wide range (``observer.EVENT_COST_US``), in which the calibration finds the cost that meets
    it: a measured step is this run's own word, the gaps an estimate (on the per-parameter
    optimizer's trace they put 0.9-2.3 us on an event, where its measured step put 3.3)."""
    return EVENT_COST_US if bare_step_ms is not None else (cost.lo_us, cost.hi_us)


def replay_central_at(cost, bare_step_ms: float | None) -> float:
    """Where in ``replay_cost_us``'s range the bare plan takes the cost without a measured step:
    where the unprofiled latency takes it (``EventCost.central_at``); with one, the middle of the
    model's range, where the calibration starts."""
    return cost.central_at if bare_step_ms is None else 0.5


def _median_of(d: dict) -> float | None:
    v = sorted(d.values())
    return v[len(v) // 2] if v else None


def _op_steps(g: StepGraph) -> tuple[np.ndarray, np.ndarray]:
    """Each operation's step, and the step as a dense code (made once a graph)."""
    got = g.__dict__.get("_op_steps")
    if got is None:
        steps = g.call_step[g.op_call]
        got = g.__dict__["_op_steps"] = (steps, np.unique(steps, return_inverse=True)[1].reshape(-1))
    return got


def _busy_ms(g: StepGraph, t) -> float:
    """The GPU's busy time per replayed step (ms; the union of its operations, streams
    overlapping counted once): the floor under any fix."""
    steps, codes = _op_steps(g)
    ok = ~np.isnan(t.op_start) & (steps >= 0)
    n = max(int(np.count_nonzero(np.bincount(codes[ok]))), 1)
    s, e = t.op_start[ok], t.op_end[ok]
    if s.size == 0:
        return 0.0
    # (a replay's starts nearly rise already: a merge sort takes their runs as they are, 14x
    # faster than the default on 50 k operations; the union does not depend on how ties fall)
    order = np.argsort(s, kind="stable")
    s, e = s[order], np.maximum.accumulate(e[order])
    starts = np.concatenate([[True], s[1:] > e[:-1]])
    first = np.flatnonzero(starts)
    ends = np.append(e[first[1:] - 1], e[-1])
    return float((ends - s[first]).sum()) / n / 1e6
