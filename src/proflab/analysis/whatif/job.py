"""The what-if model of a job: every rank's step replayed together, its collectives in lockstep.

Each rank has its own step graph and bare plan (``model.WhatIf``, calibrated on that rank's
own measured step where there is one). A collective cannot finish before every rank has
reached it: the k-th collective kernel of each rank (in launch order, over the same steps) is
given its *transfer* time, the shortest of its ranks' kernels (the rank that arrived last
waited least in it), and starts on every rank no earlier than the latest rank is ready for it.
The ranks are replayed in turn, each collective's start constraint from the others' readiness,
until nothing moves (the constraints only grow). The job's step is its slowest rank's.

A fix acts on the ranks it names (a straggler's host work) or on all of them (gradient
compression); what it saves is the job's bare step before and after, as for one trace.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from proflab.analysis.whatif.fixes import apply
from proflab.analysis.whatif.model import StepSaving, WhatIf
from proflab.analysis.whatif.replay import Plan, observed_step_ms, replay

__all__ = ["JobWhatIf", "JobPrediction"]

_ROUNDS = 8
FIDELITY = 0.10  # the profiled ranks replayed together must give back the job's step within this


@dataclass(frozen=True)
class JobPrediction(StepSaving):
    """What a set of fixes saves per bare job step (ms): the slowest rank's, before and after."""

    fixes: dict
    before_ms: float
    after_ms: float
    gain_ms: float
    replayed_before_ms: float
    source: str  # "measured" | "estimated"

    def to_dict(self) -> dict:
        return {
            "model": "replay",
            "ranks_replayed": "every rank, collectives in lockstep",
            "fixes": {("all ranks" if r is None else f"rank {r}"): [f.label or f.kind for f in fs] for r, fs in self.fixes.items()},
            **self.saving(),
            "replayed_bare_step_ms": round(self.replayed_before_ms, 3),
            "assumptions": sorted({f.assumption for fs in self.fixes.values() for f in fs}),
        }


class JobWhatIf:
    """``whatifs``: each rank's model (``rank -> WhatIf``); ``bare_step_ms``: the job's
    measured unprofiled step (its slowest rank's), when known."""

    def __init__(self, whatifs: dict[int, WhatIf], bare_step_ms: float | None = None) -> None:
        self.whatifs = {r: w for r, w in whatifs.items() if w is not None and w.available}
        self.bare_step_ms = bare_step_ms
        self.fidelity: dict = {}
        self._comm = {r: _comm_ops(w) for r, w in self.whatifs.items()}
        n = min((c.size for c in self._comm.values()), default=0)
        self._comm = {r: c[:n] for r, c in self._comm.items()}

    @property
    def available(self) -> bool:
        """Whether the ranks replay together: two or more, with their collectives, and the
        profiled ranks replayed together give back the job's own step (within
        ``FIDELITY``): where they do not (streams whose waits the timing does not show), a
        prediction from them would be a guess."""
        if "_ok" not in self.__dict__:
            self._ok = len(self.whatifs) >= 2 and all(c.size for c in self._comm.values()) and self._faithful()
        return self._ok

    def _faithful(self) -> bool:
        observed = []
        for w in self.whatifs.values():
            observed.append(observed_step_ms(w.graph))
        common = set.intersection(*(set(o) for o in observed))
        if not common:
            return False
        per_step = sorted(max(o[k] for o in observed) for k in common)
        job = per_step[len(per_step) // 2]
        replayed = self.step_ms(profiled=True)
        self.fidelity = {"observed_job_step_ms": round(job, 3), "replayed_job_step_ms": round(replayed, 3)}
        return abs(replayed - job) <= FIDELITY * job

    def step_ms(self, fixes: dict | None = None, *, profiled: bool = False) -> float:
        """The job's median replayed bare step (ms) with ``fixes`` (``rank`` or None for all
        ranks -> fixes) made; ``profiled``: the trace's own durations, profiler and all."""
        fixes = fixes or {}
        plans = {}
        for r, w in self.whatifs.items():
            p = Plan.of(w.graph) if profiled else w.bare_plan()
            plans[r] = apply(w.graph, p, *fixes.get(None, ()), *fixes.get(r, ()))
        # each collective's transfer: the shortest of its kernels across the ranks
        transfer = np.min([plans[r].op_dur[c] for r, c in self._comm.items()], axis=0)
        for r, c in self._comm.items():
            plans[r].op_dur[c] = transfer
        ready = np.zeros(transfer.size)
        steps: dict[int, dict[int, float]] = {}
        for _ in range(_ROUNDS):
            arrived = []
            for r, w in self.whatifs.items():
                not_before = plans[r].op_not_before.copy()  # (shared with the plan it was copied from)
                not_before[self._comm[r]] = ready
                plans[r].op_not_before = not_before
                t = replay(w.graph, plans[r])
                arrived.append(t.op_ready[self._comm[r]])
                steps[r] = t.step_ms
            new = np.nanmax(np.vstack(arrived), axis=0)
            if np.allclose(new, ready, atol=1_000):  # within a microsecond: settled
                break
            ready = new
        common = set.intersection(*(set(s) for s in steps.values())) if steps else set()
        per_step = sorted(max(steps[r][k] for r in steps) for k in common)
        return per_step[len(per_step) // 2] if per_step else 0.0

    def predict(self, fixes: dict) -> JobPrediction | None:
        if not self.available:
            return None
        before, after = self.step_ms(), self.step_ms(fixes)
        measured = self.bare_step_ms
        base = measured if measured is not None else before
        gain = min(max(before - after, 0.0), base)
        return JobPrediction(fixes=fixes, before_ms=base, after_ms=base - gain, gain_ms=gain, replayed_before_ms=before,
                             source="measured" if measured is not None else "estimated")  # fmt: skip


def _comm_ops(w: WhatIf) -> np.ndarray:
    """The rank's collective kernels inside its replayed steps, in launch order."""
    g = w.graph
    steps = g.call_step[g.op_call]
    sel = np.flatnonzero(g.op_comm & (steps >= 0))
    return sel[np.argsort(g.call_start[g.op_call[sel]], kind="stable")]


