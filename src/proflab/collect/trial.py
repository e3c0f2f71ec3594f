"""``proflab try``: make a fix without code changes and measure what it saves.

The program runs bare (no profiler: ``proflab run``'s runtime only times its steps, on the
GPU's clock once it uses CUDA, as ``run`` measures unprofiled steps) as it is and with the fix
(``knobs``), in interleaved rounds (as it is, with the fix; then the other way round, so a
drift of the machine falls on both), and again while the 95 % interval of the saving is wider
than asked, up to a number of rounds. The saving is the difference of the two sides' median
steps; its interval comes from resampling the runs and, within each, its steps (the runs are
replicates: the variation between them counts, not only the steps').

Beside it, the predicted saving: the finding whose fix this is, from a profiled run of the
program as it is (made first, or given with ``--from``). Both are written to ``trial.json`` in
the trial's folder, with every run's directory.
"""

from __future__ import annotations

import json

import os
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from proflab.collect import rundir
from proflab.collect.knobs import Knob
from proflab.errors import UsageError

__all__ = ["TrialOptions", "Trial", "trial", "predicted_for"]


@dataclass(frozen=True)
class TrialOptions:
    root: str = rundir.DEFAULT_ROOT
    rounds: int = 3  # at least this many rounds (one run a side each)
    max_rounds: int = 8  # at most
    target_pct: float = 2.0  # stop once the saving's 95 % interval is within +-this many % of the step
    predict: bool = True  # a profiled run of the program first, for the predicted saving
    from_path: str | None = None  # ... or that run directory or trace instead
    timeout_s: float = 0.0  # each run's exit timeout (0: proflab run's default)
    seed: int = 0


@dataclass
class Trial:
    """The measured saving (ms and % of the step as it is, fix minus as it is, negative =
    faster) with its 95 % interval, each side's runs, and the predicted saving where known."""

    knobs: list[str]
    command: list[str]
    folder: str
    base_runs: list[dict] = field(default_factory=list)
    fix_runs: list[dict] = field(default_factory=list)
    base_ms: float | None = None
    fix_ms: float | None = None
    change_ms: float | None = None
    change_pct: float | None = None
    ci95_pct: tuple[float, float] | None = None
    clock: str | None = None
    predicted: dict | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        if self.ci95_pct is None:
            return "unknown"
        lo, hi = self.ci95_pct
        return "faster" if hi < 0 else "slower" if lo > 0 else "no clear change"

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "proflab.try/1", **asdict(self), "verdict": self.verdict}


def _steps(run: Path) -> tuple[list[float], str | None, int]:
    """A run's unprofiled step times (ms; every process's, by rank: a job's step is its
    slowest rank's), the clock, and the program's exit status."""
    meta = json.loads((run / rundir.META).read_text())
    per_proc, clock = [], None
    for p in sorted((run / "processes").glob("*.json")):
        info = json.loads(p.read_text())
        st = info.get("step_times") or {}
        if st.get("bare_steps_ms"):
            per_proc.append(st["bare_steps_ms"])
            clock = clock or st.get("clock")
    if not per_proc:
        return [], clock, meta.get("exit_status")
    n = min(len(x) for x in per_proc)
    steps = [max(x[-n:][i] for x in per_proc) for i in range(n)]
    return steps, clock, meta.get("exit_status")


def _interval(base: list[list[float]], fix: list[list[float]], seed: int, n: int = 2000) -> tuple[float, float]:
    """95 % interval (% of the base median) of median(fix) - median(base): runs resampled,
    then steps within each resampled run."""
    import numpy as np

    rng = np.random.default_rng(seed)

    def side(runs):
        pick = rng.integers(0, len(runs), size=(n, len(runs)))
        out = np.empty(n)
        for i in range(n):
            steps = np.concatenate([np.asarray(runs[j])[rng.integers(0, len(runs[j]), len(runs[j]))] for j in pick[i]])
            out[i] = np.median(steps)
        return out

    b, f = side(base), side(fix)
    d = 100.0 * (f - b) / b
    return float(np.percentile(d, 2.5)), float(np.percentile(d, 97.5))


def trial(cmd: list[str], knobs: list[Knob], opts: TrialOptions = TrialOptions(), *, out=sys.stderr) -> Trial:
    """Measure ``knobs`` on ``cmd`` (see the module doc). Raises UsageError when the program
    fails or makes no steps to time."""
    from proflab.collect.launcher import RunOptions, run

    if not knobs:
        raise UsageError("name the fix to try, e.g. proflab try tf32 -- python train.py")
    # (the knobs' text made a name: a value with "/" once made nested folders; two trials in one second a -2)
    folder = rundir.new_run_dir(opts.root, f"try-{'+'.join(str(k) for k in knobs)[:40]}")
    t = Trial(knobs=[str(k) for k in knobs], command=list(cmd), folder=str(folder))
    if opts.from_path or opts.predict:
        t.predicted = predicted_for(knobs, cmd, folder, opts, out)
    exit_kw = {"exit_timeout_s": opts.timeout_s} if opts.timeout_s else {}
    base_steps: list[list[float]] = []
    fix_steps: list[list[float]] = []
    ci: tuple[float, float] | None = None  # the interval over every round so far
    with open(os.devnull, "w") as quiet:
        for r in range(opts.max_rounds):
            order = [("base", ()), ("fix", tuple(knobs))]
            if r % 2:
                order.reverse()
            for label, ks in order:
                out.write(f"proflab try: round {r + 1}, {'as it is' if label == 'base' else 'with ' + ', '.join(t.knobs)}\n")
                out.flush()
                o = RunOptions(root=str(folder), name=f"{label}{r + 1}", window="none", analyze=False, monitor=False,
                               knobs=ks, **exit_kw)  # fmt: skip
                rc = run(cmd, o, out=quiet)
                path = max(folder.glob(f"*-{label}{r + 1}"), key=lambda p: p.stat().st_mtime)
                steps, clock, _ = _steps(path)
                entry = {"run": str(path.relative_to(folder)), "exit_status": rc, "steps": len(steps),
                         "median_ms": round(statistics.median(steps), 4) if steps else None}  # fmt: skip
                (t.base_runs if label == "base" else t.fix_runs).append(entry)
                if rc != 0:
                    raise UsageError(f"the program exited {rc} {'as it is' if label == 'base' else 'with ' + ', '.join(t.knobs)} "
                                     f"(its run: {path})")  # fmt: skip
                if len(steps) < 3:
                    raise UsageError(f"{path}: the program made too few steps to time ({len(steps)}); proflab try times "
                                     "optimizer steps or proflab.step() calls")  # fmt: skip
                (base_steps if label == "base" else fix_steps).append(steps)
                t.clock = t.clock or clock
            if r + 1 >= opts.rounds:
                ci = _interval(base_steps, fix_steps, opts.seed)
                if (ci[1] - ci[0]) / 2 <= opts.target_pct:
                    break
    base = statistics.median([x for s in base_steps for x in s])
    fix = statistics.median([x for s in fix_steps for x in s])
    t.base_ms, t.fix_ms = round(base, 4), round(fix, 4)
    t.change_ms = round(fix - base, 4)
    t.change_pct = round(100.0 * (fix - base) / base, 2)
    lo, hi = ci if ci is not None else _interval(base_steps, fix_steps, opts.seed)  # (the last round's, not again)
    t.ci95_pct = (round(lo, 2), round(hi, 2))
    if (hi - lo) / 2 > opts.target_pct:
        t.notes.append(f"the interval is still wider than +-{opts.target_pct:g}% after {len(base_steps)} rounds (--max-rounds)")
    rundir.write_json(folder / "trial.json", t.to_dict())
    return t


def predicted_for(knobs: list[Knob], cmd: list[str], folder: Path, opts: TrialOptions, out) -> dict:
    """The finding whose fix these knobs make, and its predicted saving: from ``--from`` (a run
    directory or a trace), else from a profiled run of the program as it is, made here."""
    from proflab.collect.launcher import RunOptions, run

    path = opts.from_path
    if path is None:
        out.write("proflab try: a profiled run first, for the predicted saving\n")
        out.flush()
        with open(os.devnull, "w") as quiet:
            run(cmd, RunOptions(root=str(folder), name="profiled", monitor=False), out=quiet)
        path = str(max(folder.glob("*-profiled"), key=lambda p: p.stat().st_mtime))
    analysis = Path(path) / "analysis.json" if Path(path).is_dir() else None
    if analysis is not None and analysis.exists():
        doc = json.loads(analysis.read_text())
    else:
        from proflab.readers import load_trace
        from proflab.readers.rundir import unprofiled_step_ms
        from proflab.report.analyze import analyze

        doc = analyze(load_trace(path), bare_step_ms=unprofiled_step_ms(Path(path))).to_dict()
    findings = doc.get("findings") or [f for r in doc.get("reports", []) for f in r.get("findings", [])]
    wanted = {str(k).split("=")[0] for k in knobs}
    for f in findings:
        named = (f.get("evidence") or {}).get("proflab_try")
        if named and wanted & {w.split("=")[0] for w in named.split(" -- ")[0].split()[2:]}:
            return {"from": path, "finding": f["id"], "predicted_gain_ms": f["est_gain_ms"], "predicted_gain_pct": f["est_gain_pct"],
                    "model": (f.get("prediction") or {}).get("model")}  # fmt: skip
    return {"from": path, "finding": None, "predicted_gain_ms": 0.0, "predicted_gain_pct": 0.0,
            "note": "no finding of the profiled run names this fix: none is predicted to save time"}  # fmt: skip


