"""Predicted against measured: each finding's gain on the gain-truth set, beside the saving its
fix made when it was made for real.

    python benchmarks/gains_truth.py            # the table of benchmarks/README.md
    python benchmarks/gains_truth.py --estimated  # without the measured bare step (as a plain trace)

Each row analyses the program's trace as recorded before the fix (``tests/data/gains``, or
the two-GPU jobs of ``tests/data/kineto/nccl``), with the bare step ``proflab run`` would have
measured (the interleaved median of the program before the fix), takes the gain of the
finding that names the fix, and sets it beside the measured saving (the difference of the
bare medians, with its 95 % interval). The target: |predicted - measured| within 15 % of the
measured bare step, 3 points where the measured gain is under 10 % (or the prediction inside
the measured saving's 95 % interval, where that cannot tell the saving from none).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GAINS = ROOT / "tests" / "data" / "gains"
NCCL = ROOT / "tests" / "data" / "kineto" / "nccl"


@dataclass(frozen=True)
class Row:
    program: str
    fix: str  # the variant that made the fix
    finding: str  # the finding id whose fix it is ("" where none is expected)
    part: str = ""  # launch_bound's breakdown part that names the fix, where it is not the first

    @property
    def label(self) -> str:
        return f"{self.program} / {self.fix}"


ROWS = (
    Row("gpt_char", "noitem", "sync_bound"),
    Row("gpt_char", "compile", "launch_bound", part="elementwise"),
    Row("nanogpt", "compile", "launch_bound", part="elementwise"),
    Row("nanogpt", "graphs", "launch_bound", part="small launches"),
    Row("lm_sync", "nosync", "sync_bound"),
    Row("cnn_loader", "workers", "host_bound"),
    Row("pageable_h2d", "pinned", "pageable_memcpy"),
    Row("tf32_mlp", "tf32", "tensor_cores_unused"),
    Row("amp_lm", "bf16", "tensor_cores_tf32"),
    Row("foreach_adam", "fused", "launch_bound", part="optimizer"),
    Row("graph_mlp", "graph", "launch_bound", part="small launches"),
    Row("host_busy", "offloaded", "host_bound"),
    Row("alloc_frag", "expandable", ""),
)


# two-GPU jobs (tests/data/kineto/nccl): the job before the fix, and the same job recorded with it
JOB_ROWS = (
    ("straggler", "balanced", "load_imbalance", "rank 1's 30 ms of host work a step removed (the balanced job)"),
    ("commbound", "commbound_fixed", "communication_bound", "bf16 compression hook, 100 MB buckets, gradient_as_bucket_view"),
)


def truth() -> dict:
    return json.loads((GAINS / "truth.json").read_text())["programs"]


def _job_steps(scenario: str) -> list[float]:
    """The job's bare GPU-side step times: per step, its slowest rank's (ms)."""
    t = json.loads((NCCL / scenario / "2gpu" / "truth.json").read_text())
    per_rank = [r["bare"]["gpu_step_ms"] for r in t["ranks"]]
    return [max(x) for x in zip(*per_rank)]


def predict_job(before: str, after: str, finding: str, *, measured_bare: bool = True) -> dict:
    """A two-GPU row: the job's finding's predicted gain against the bare saving measured
    between the job as recorded and the same job recorded with the fix (ms per step)."""
    import statistics

    import numpy as np

    a, b = _job_steps(before), _job_steps(after)
    base, fixed = statistics.median(a), statistics.median(b)
    rng = np.random.default_rng(0)
    diffs = np.median(rng.choice(a, (2000, len(a))), axis=1) - np.median(rng.choice(b, (2000, len(b))), axis=1)
    from proflab.report.job import analyze_job

    report = analyze_job([NCCL / before / "2gpu"], bare_step_ms=base if measured_bare else None, in_process=True)
    f = next((f for f in report.findings if f.id == finding), None)
    gain = f.est_gain_ms if f is not None else 0.0
    model = (f.prediction or {}).get("model") if f is not None else None
    m = base - fixed
    err = gain - m
    ci = (float(np.percentile(diffs, 2.5)), float(np.percentile(diffs, 97.5)))
    return {
        "row": f"2x H200 {before} / {after}", "finding": f"{finding} ({model})" if f is not None else "no finding", "bare_ms": round(base, 3),
        "measured_ms": round(m, 3), "measured_ci95_ms": [round(x, 3) for x in ci], "predicted_ms": round(gain, 3),
        "predicted_range_ms": [round(gain, 3)] * 2, "error_ms": round(err, 3), "error_pct_of_step": round(100 * err / base, 1),
        "within": abs(err) <= tolerance_ms(base, m) or ci[0] <= gain <= ci[1],
    }  # fmt: skip


def tolerance_ms(base_ms: float, measured_ms: float) -> float:
    """15 % of the measured bare step; 3 points where the measured gain is under 10 %."""
    return base_ms * (0.03 if measured_ms < 0.10 * base_ms else 0.15)


def predict(row: Row, *, measured_bare: bool = True) -> dict:
    """The row's prediction next to its measurement (ms per step)."""
    import proflab

    t = truth()[row.program]
    base = t["bare"]["base"]["median_ms"]
    m = t["measured"][row.fix]
    report = proflab.analyze(proflab.load(GAINS / f"{row.program}.base.pt.trace.json.gz"),
                             bare_step_ms=base if measured_bare else None)  # fmt: skip
    gain, source, rng = 0.0, "no finding", (0.0, 0.0)
    f = next((f for f in report.findings if f.id == row.finding), None) if row.finding else None
    if f is not None:
        gain, source = f.est_gain_ms, f.id
        rng = tuple((f.prediction or {}).get("predicted_gain_range_ms") or (gain, gain))
        if row.part:
            parts = f.evidence.get("breakdown") or []
            p = next((p for p in parts if row.part in p["what"]), None)
            gain = p.get("predicted_gain_ms", 0.0) if p else 0.0
            rng = tuple(p.get("predicted_gain_range_ms") or (gain, gain)) if p else (0.0, 0.0)
            source = f"{f.id}: {p['what'][:40] if p else row.part + ' (no such part)'}"
    err = gain - m["gain_ms"]
    return {
        "row": row.label, "finding": source, "bare_ms": base, "measured_ms": m["gain_ms"], "measured_ci95_ms": m["ci95_ms"],
        "predicted_ms": round(gain, 3), "predicted_range_ms": [round(x, 3) for x in rng],
        "error_ms": round(err, 3), "error_pct_of_step": round(100 * err / base, 1),
        # the target, or inside the measurement's own 95 % interval (a saving it cannot tell from none)
        "within": abs(err) <= tolerance_ms(base, m["gain_ms"]) or m["ci95_ms"][0] <= gain <= m["ci95_ms"][1],
    }  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--estimated", action="store_true", help="analyse without the measured bare step")
    args = ap.parse_args(argv)
    print("| program / fix | finding | bare ms | measured ms (95% CI) | predicted ms (range) | error (% of step) | within |")
    print("|---|---|---:|---:|---:|---:|---|")
    ok = 0
    results = [predict(row, measured_bare=not args.estimated) for row in ROWS]
    results += [predict_job(b, a, f, measured_bare=not args.estimated) for b, a, f, _ in JOB_ROWS]
    for r in results:
        ok += r["within"]
        lo, hi = r["measured_ci95_ms"]
        print(f"| {r['row']} | {r['finding']} | {r['bare_ms']:.2f} | {r['measured_ms']:.2f} ({lo:.2f} to {hi:.2f}) | "
              f"{r['predicted_ms']:.2f} ({r['predicted_range_ms'][0]:.2f}-{r['predicted_range_ms'][1]:.2f}) | "
              f"{r['error_pct_of_step']:+.1f} | {'yes' if r['within'] else 'NO'} |")
    print(f"\n{ok} of {len(results)} within the target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
