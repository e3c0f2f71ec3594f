"""``proflab try``: make a fix without code changes and measure what it saves.

The program runs bare (no profiler: ``proflab run``'s runtime only times its steps, on the
GPU's clock once it uses CUDA, as ``run`` measures unprofiled steps) as it is and with the fix
(``knobs``), in interleaved rounds (as it is, with the fix; then the other way round, so a
drift of the machine falls on both), and again while the 95 % interval of the saving is wider
than asked, up to a number of rounds. The saving is the difference of the two sides' median
steps; its interval comes from resampling the runs and, within each, its steps (the runs are
replicates: the variation between them counts, not only the steps').

Runs of one side that fall into separate groups (a bimodal machine or program: some runs at
~8 ms a step, others at ~190 ms; two runs or more in each) make a difference of medians
meaningless, however many rounds are run: the trial detects them (:func:`groups`), stops, says
which runs fell where, and its verdict is ``inconclusive``, saying why. One run apart from its
side's others is a disturbed run: said in the notes, and left aside by the estimate. So is a trial whose interval is still wider
than asked after ``--max-rounds``. The point estimate is the median of the runs' medians (a
run is a replicate: one disturbed run does not move it), the interval as above.

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

__all__ = ["TrialOptions", "Trial", "trial", "predicted_for", "groups", "GROUP_RATIO"]

# Two groups of runs: the slowest run of the faster group and the fastest of the slower one at
# least this far apart (x), and each group at least two runs and a fifth of them. Steps of one
# loop spread by tens of percent (a DataLoader's, a host-bound loop's); not by half again.
GROUP_RATIO = 1.5


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
    # runs that formed separate groups (see groups()): {"ratio", "groups": [{"median_ms", "runs"}, ...]}
    groups: dict | None = None
    inconclusive: str | None = None  # why the measurement cannot say (None: it can)

    @property
    def verdict(self) -> str:
        if self.ci95_pct is None:
            return "unknown"
        if self.inconclusive:
            return "inconclusive"
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


def groups(medians: dict[str, float], ratio: float = GROUP_RATIO, least_runs: int = 2) -> dict | None:
    """Whether runs (name -> median step, ms) fall into two separate groups: split at the
    widest gap between sorted medians (on a log scale), two groups when that gap is at least
    ``ratio`` and each holds at least a fifth of the runs and ``least_runs`` (one run apart is
    an outlier, which the median of medians leaves aside, not a mode). None otherwise."""
    runs = sorted((v, k) for k, v in medians.items() if v and v > 0)
    if len(runs) < 2 * least_runs or len(runs) < 2:
        return None
    gaps = [(runs[i + 1][0] / runs[i][0], i) for i in range(len(runs) - 1)]
    gap, i = max(gaps)
    low, high = runs[: i + 1], runs[i + 1:]
    least = max(least_runs, len(runs) // 5)
    if gap < ratio or len(low) < least or len(high) < least:
        return None
    return {"ratio": round(gap, 2), "groups": [
        {"median_ms": round(statistics.median(v for v, _ in g), 4), "runs": [k for _, k in g]} for g in (low, high)]}


def _groups_text(g: dict) -> str:
    lo, hi = g["groups"]
    return (f"the runs fall into two groups, about {lo['median_ms']:.3g} ms a step ({', '.join(lo['runs'])}) and about "
            f"{hi['median_ms']:.3g} ms ({', '.join(hi['runs'])}), {g['ratio']:.3g}x apart: the machine or the program runs "
            "in two modes, and a difference of medians says which mode each side happened to get, not what the fix saves")


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
                t.groups = _mixed_groups(t)
                if t.groups is not None:  # more rounds cannot make two modes one: stop, and say so
                    t.inconclusive = _groups_text(t.groups)
                    t.notes.append(f"stopped after {r + 1} round(s): the runs fall into two groups")
                    break
                if (ci[1] - ci[0]) / 2 <= opts.target_pct:
                    break
    # robust: the median of the runs' medians (a run is a replicate; one disturbed run does not move it)
    base = statistics.median(statistics.median(s) for s in base_steps)
    fix = statistics.median(statistics.median(s) for s in fix_steps)
    t.base_ms, t.fix_ms = round(base, 4), round(fix, 4)
    t.change_ms = round(fix - base, 4)
    t.change_pct = round(100.0 * (fix - base) / base, 2)
    lo, hi = ci if ci is not None else _interval(base_steps, fix_steps, opts.seed)  # (the last round's, not again)
    t.ci95_pct = (round(lo, 2), round(hi, 2))
    if t.groups is None:
        t.notes += _outliers(t)
    if (hi - lo) / 2 > opts.target_pct and t.groups is None:
        t.notes.append(f"the interval is still wider than +-{opts.target_pct:g}% after {len(base_steps)} rounds (--max-rounds)")
        if lo < 0 < hi:  # neither faster nor slower, and not narrow enough to say "no change" either
            t.inconclusive = (f"the 95% interval ({lo:+.2f} to {hi:+.2f}%) spans no change and is wider than "
                              f"+-{opts.target_pct:g}% after {len(base_steps)} rounds: the steps vary more than the fix "
                              "changes them (more --max-rounds, longer runs, or a quieter machine)")
    rundir.write_json(folder / "trial.json", t.to_dict())
    return t


def _run_medians(runs: list[dict], side: str) -> dict[str, float]:
    """Each run's median step (ms), named by side and round (``as it is 1``, ``fixed 2``)."""
    return {f"{side} {i}": r["median_ms"] for i, r in enumerate(runs, 1) if r.get("median_ms")}


def _mixed_groups(t: Trial) -> dict | None:
    """Groups of runs within a side (its runs split, whatever the fix does), said over all the
    runs; None where only the sides differ (a fix that halves the step makes two groups too:
    that is the saving)."""
    base, fix = _run_medians(t.base_runs, "as it is"), _run_medians(t.fix_runs, "fixed")
    split = groups(base) or groups(fix)
    if split is None:
        return None
    both = groups({**base, **fix})
    # said over all the runs where that split is the side's too (each group holds both sides)
    mixed = both is not None and all({n.split()[0] for n in g["runs"]} == {"as", "fixed"} for g in both["groups"])
    return both if mixed else split


def _outliers(t: Trial) -> list[str]:
    """A run apart from the rest of its side (1.5x or more; one run, so not a mode): said, and
    left to the median of medians."""
    out = []
    for side, runs in (("as it is", t.base_runs), ("fixed", t.fix_runs)):
        g = groups(_run_medians(runs, side), least_runs=1)
        if g is not None:
            lone, rest = sorted(g["groups"], key=lambda x: len(x["runs"]))
            out.append(f"{lone['runs'][0]} ran at {lone['median_ms']:.3g} ms a step, {g['ratio']:.3g}x apart from the "
                       f"other runs {'as it is' if side == 'as it is' else 'with the fix'} (about {rest['median_ms']:.3g} ms): "
                       "a disturbed run, left aside by the median of the runs' medians")
    return out


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


