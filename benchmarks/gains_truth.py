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

Two halves. ``tune``: rows the models were set on: the team's own programs (``tests/data/gains``,
the two-GPU jobs) and a first set of programs nobody on the team wrote (Hugging Face's Trainer on
GPT-2, torchvision's ResNet-50 with its DataLoader, Lightning's demo transformer, ``generate()``
at batch 1, 8 and 32), whose first-sight results are kept in benchmarks/README.md. ``report``:
programs nobody on the team wrote, recorded after the models were set and analysed once, never
tuned on. Third-party programs are installed from the package index and run unmodified
(``tests/data/thirdparty``, ``tests/data/inference/h100``, ``h100-rounds`` and ``h100-heldout``), each fix one argument as a user makes
it, recorded by ``tests/data/record/record_thirdparty.py`` and ``record_inference.py``.

A ``generate()`` row is per output token: the bare saving is the difference of the median
inter-token latency (CUDA events, no profiler; every gap of every timed run) between the
generation as written and with the fix (a run's first timed generation can still meet a
recompilation: the median of its gaps is not moved by it, a run's TPOT is); the
finding's gain is per token where the report takes its tokens as steps, and a gain per generation
is divided by the generation's decode forwards. Those traces have no measured bare step to give
the analysis, so a ``generate()`` row reads the same in both tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GAINS = ROOT / "tests" / "data" / "gains"
NCCL = ROOT / "tests" / "data" / "kineto" / "nccl"
THIRD = ROOT / "tests" / "data" / "thirdparty"
INFERENCE = ROOT / "tests" / "data" / "inference" / "h100"
ROUNDS = ROOT / "tests" / "data" / "inference" / "h100-rounds"  # the variants timed in turn (rounds)
HELDOUT = ROOT / "tests" / "data" / "inference" / "h100-heldout"  # the first set's shape again, on another H100, later


@dataclass(frozen=True)
class Row:
    program: str
    fix: str  # the variant that made the fix
    finding: str  # the finding id whose fix it is ("" where none is expected)
    part: str = ""  # launch_bound's breakdown part that names the fix, where it is not the first
    as_named: bool = False  # the fix made is the one the part names, predicted beside its own gain (``as_named``)

    @property
    def label(self) -> str:
        return f"{self.program} / {self.fix}"


ROWS = (
    Row("gpt_char", "noitem", "sync_bound"),
    Row("gpt_char", "compile", "compile"),
    Row("nanogpt", "compile", "compile"),
    Row("nanogpt", "graphs", "launch_bound", part="small launches", as_named=True),  # mode="reduce-overhead"
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


@dataclass(frozen=True)
class ThirdRow:
    """A third-party program's fix: the variant the trace was recorded from, and the variant with
    the fix (``tests/data/thirdparty/truth.json``; ``folder``: a later set's folder under it, with
    its own ``truth.json``; its runs are named as ``record_thirdparty.py`` names them,
    ``<program>.<variant>/``, or ``<program>.<variant>.shapes/`` where they record shapes)."""

    program: str
    base: str
    fix: str
    finding: str
    part: str = ""
    half: str = "tune"
    folder: str = ""

    @property
    def label(self) -> str:
        return f"{self.program} / {self.base} -> {self.fix}" + (f" ({self.folder})" if self.folder else "")


THIRD_ROWS = (
    ThirdRow("hf_gpt2", "base", "tf32", "tensor_cores_unused"),  # TrainingArguments(tf32=True)
    ThirdRow("hf_gpt2", "tf32", "bf16", "tensor_cores_tf32"),  # (bf16=True)
    ThirdRow("hf_gpt2", "bf16", "bf16-compile", "compile"),  # (torch_compile=True)
    ThirdRow("lightning_lm", "base", "high", "tensor_cores_unused"),  # set_float32_matmul_precision("high")
    ThirdRow("lightning_lm", "high", "bf16", "tensor_cores_tf32"),  # Trainer(precision="bf16-mixed")
    ThirdRow("tv_resnet", "base", "workers", "host_bound"),  # DataLoader(num_workers=8, pin_memory=True, ...)
    ThirdRow("tv_resnet", "workers", "amp", "tensor_cores_tf32"),  # bf16 autocast + channels_last
    # the report half: recorded after the models were set, analysed once
    ThirdRow("hf_bert", "base", "tf32", "tensor_cores_unused", half="report"),  # TrainingArguments(tf32=True)
    ThirdRow("hf_bert", "tf32", "bf16", "tensor_cores_tf32", half="report"),  # (bf16=True)
    ThirdRow("hf_bert", "bf16", "bf16-compile", "compile", half="report"),  # (torch_compile=True)
    # the report half's second set: recorded in one later session, named before any was analysed
    ThirdRow("hf_llama", "base", "tf32", "tensor_cores_unused", half="report"),  # TrainingArguments(tf32=True)
    ThirdRow("hf_llama", "tf32", "bf16", "tensor_cores_tf32", half="report"),  # (bf16=True)
    ThirdRow("hf_llama", "bf16", "bf16-compile", "compile", half="report"),  # (torch_compile=True)
    ThirdRow("timm_vit", "base", "workers", "host_bound", half="report"),  # DataLoader(num_workers=8, ...)
    ThirdRow("timm_vit", "workers", "high", "tensor_cores_unused", half="report"),  # set_float32_matmul_precision
    ThirdRow("timm_vit", "high", "amp", "tensor_cores_tf32", half="report"),  # bf16 autocast
    ThirdRow("lightning_cnn", "base", "workers", "host_bound", half="report"),  # DataLoader(num_workers=8, ...)
    ThirdRow("lightning_cnn", "workers", "high", "tensor_cores_unused", half="report"),  # set_float32_matmul_precision
    # (lightning_cnn workers -> bf16-mixed was measured too (truth.json); it is no row: the fix answers two
    # findings at once, TF32 convolutions and FP32 linears, and a row compares one finding's gain)
    # the report half's third set: the TF32 traces with shapes (the per-op model's BF16 prediction), on a
    # second H100, named before they were analysed
    ThirdRow("hf_bert", "tf32", "bf16", "tensor_cores_tf32", half="report", folder="shapes"),
    ThirdRow("hf_llama", "tf32", "bf16", "tensor_cores_tf32", half="report", folder="shapes"),
    # the report half's fourth set: Trainer programs at Pythia-160M's and Qwen2.5-0.5B's shapes, with
    # shapes, on an H100, each named before the recording (base -> tf32, tf32 -> bf16, bf16 -> bf16-compile);
    # the time limit cut hf_neox's bf16 trace and hf_qwen2's base trace short; those traces and hf_qwen2's
    # others were recorded in a later session, on another H100, with hf_qwen2's bf16 and bf16-compile
    # timed in turn beside its bf16 trace (``later/truth.json``: ``timed_again``)
    ThirdRow("hf_neox", "base", "tf32", "tensor_cores_unused", half="report", folder="later"),
    ThirdRow("hf_neox", "tf32", "bf16", "tensor_cores_tf32", half="report", folder="later"),
    ThirdRow("hf_neox", "bf16", "bf16-compile", "compile", half="report", folder="later"),
    ThirdRow("hf_qwen2", "base", "tf32", "tensor_cores_unused", half="report", folder="later"),
    ThirdRow("hf_qwen2", "tf32", "bf16", "tensor_cores_tf32", half="report", folder="later"),
    ThirdRow("hf_qwen2", "bf16", "bf16-compile", "compile", half="report", folder="later"),
)


@dataclass(frozen=True)
class GenRow:
    """A ``generate()`` fix at one batch size (``folder``'s ``truth.json``)."""

    batch: int
    base: str
    fix: str
    finding: str
    half: str = "tune"
    case: str = ""  # the case names' prefix in truth.json ("" for the first set)
    folder: Path = INFERENCE
    tag: str = ""  # before the batch in the row's label, where a set's case names are another set's

    @property
    def label(self) -> str:
        return f"generate {self.tag}{self.case}b{self.batch} / {self.base} -> {self.fix}"


_GEN_FIXES = (
    ("nocache", "cache", "kv_cache_recompute"),  # use_cache=True
    ("cache", "static-compile", "decode_launch_bound"),  # cache_implementation="static" (generate compiles it)
)
GEN_ROWS = tuple(GenRow(b, base, fix, finding) for base, fix, finding in _GEN_FIXES for b in (1, 8, 32))
# the report half: TinyLlama's shape (1.1 B parameters) at batch 1 and 8, each fix, its variants timed in
# turn (tests/data/inference/h100-rounds, "l3-"). Both generate() sets were recorded again with
# TEARDOWN_CUPTI=1: the earlier recordings' bare runs after a profiled one ran with CUPTI left attached
# (1.3x slower eager tokens), which had made use_cache=True look 1.5-2.9 ms a token slower
GEN_ROWS += tuple(GenRow(b, base, fix, finding, half="report", case="l3-", folder=ROUNDS)
                  for base, fix, finding in _GEN_FIXES for b in (1, 8))
# the report half's third set: the first set's 156 M model at batch 1 and 8 recorded again on another
# H100 (tests/gpu/test_inference_live.py's recording), after the models were set, analysed once
GEN_ROWS += tuple(GenRow(b, base, fix, finding, half="report", folder=HELDOUT, tag="h-")
                  for base, fix, finding in _GEN_FIXES for b in (1, 8))


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
        "row": f"2x H200 {before} / {after}", "half": "tune", "finding": f"{finding} ({model})" if f is not None else "no finding", "bare_ms": round(base, 3),
        "measured_ms": round(m, 3), "measured_ci95_ms": [round(x, 3) for x in ci], "predicted_ms": round(gain, 3),
        "predicted_range_ms": [round(gain, 3)] * 2, "error_ms": round(err, 3), "error_pct_of_step": round(100 * err / base, 1),
        "within": abs(err) <= tolerance_ms(base, m) or ci[0] <= gain <= ci[1],
    }  # fmt: skip


def tolerance_ms(base_ms: float, measured_ms: float) -> float:
    """15 % of the measured bare step; 3 points where the measured gain is under 10 %."""
    return base_ms * (0.03 if measured_ms < 0.10 * base_ms else 0.15)


def _finding_gain(report, finding: str, part: str = "", as_named: bool = False) -> tuple[float, str, tuple[float, float]]:
    """The gain (ms) of the finding that names the fix, where it names it, and its range.
    ``compile``: torch.compile's claim, whichever finding makes it: launch_bound's fusion part on a
    launch-bound step, else unfused_elementwise. ``as_named``: the part's prediction of the fix as
    it names it (torch.compile(mode='reduce-overhead'): the fusion with the graphs) where it has one."""
    if finding == "compile":
        found = {f.id for f in report.findings}
        finding, part = ("launch_bound", "elementwise") if "launch_bound" in found else ("unfused_elementwise", "")
    gain, source, rng = 0.0, "no finding", (0.0, 0.0)
    f = next((f for f in report.findings if f.id == finding), None) if finding else None
    if f is not None:
        gain, source = f.est_gain_ms, f.id
        rng = tuple((f.prediction or {}).get("predicted_gain_range_ms") or (gain, gain))
        if part:
            parts = f.evidence.get("breakdown") or []
            p = next((p for p in parts if part in p["what"]), None)
            if p and as_named and p.get("as_named"):
                p = p["as_named"] | {"what": p["what"] + " (as named)"}
            gain = p.get("predicted_gain_ms", 0.0) if p else 0.0
            rng = tuple(p.get("predicted_gain_range_ms") or (gain, gain)) if p else (0.0, 0.0)
            source = f"{f.id}: {p['what'][:40] if p else part + ' (no such part)'}"
    return gain, source, rng


def _row(label: str, half: str, source: str, base: float, measured: float, ci: tuple, gain: float, rng: tuple) -> dict:
    err = gain - measured
    return {
        "row": label, "half": half, "finding": source, "bare_ms": round(base, 3), "measured_ms": round(measured, 3),
        "measured_ci95_ms": [round(x, 3) for x in ci], "predicted_ms": round(gain, 3),
        "predicted_range_ms": [round(x, 3) for x in rng], "error_ms": round(err, 3),
        "error_pct_of_step": round(100 * err / base, 1),
        # the target, or inside the measurement's own 95 % interval (a saving it cannot tell from none)
        "within": abs(err) <= tolerance_ms(base, measured) or ci[0] <= gain <= ci[1],
    }  # fmt: skip


def predict(row: Row, *, measured_bare: bool = True) -> dict:
    """The row's prediction next to its measurement (ms per step)."""
    import proflab

    t = truth()[row.program]
    base = t["bare"]["base"]["median_ms"]
    m = t["measured"][row.fix]
    report = proflab.analyze(proflab.load(_committed(GAINS, f"{row.program}.base")),
                             bare_step_ms=base if measured_bare else None)  # fmt: skip
    gain, source, rng = _finding_gain(report, row.finding, row.part, row.as_named)
    return _row(row.label, "tune", source, base, m["gain_ms"], tuple(m["ci95_ms"]), gain, rng)


def _committed(folder: Path, stem: str) -> Path:
    """A committed trace: ``<stem>.pt.trace.json.xz`` where the large ones were recompressed,
    else ``.pt.trace.json.gz``."""
    xz = folder / f"{stem}.pt.trace.json.xz"
    return xz if xz.is_file() else folder / f"{stem}.pt.trace.json.gz"


def _saving(a: list[float], b: list[float], n: int = 2000) -> tuple[float, tuple[float, float]]:
    """The difference of two samples' medians, with its 95 % bootstrap interval."""
    import numpy as np

    rng = np.random.default_rng(0)
    a_, b_ = np.asarray(a), np.asarray(b)
    diffs = np.median(rng.choice(a_, (n, a_.size)), axis=1) - np.median(rng.choice(b_, (n, b_.size)), axis=1)
    return float(np.median(a_) - np.median(b_)), (float(np.percentile(diffs, 2.5)), float(np.percentile(diffs, 97.5)))


def third_truth(folder: Path = THIRD) -> dict:
    return json.loads((folder / "truth.json").read_text())["programs"]


def _timing(program: dict, *variants: str) -> dict:
    """The bare timing that holds ``variants``, timed in turn in one session: the program's latest
    timing (``timed_again``, oldest first) that holds them all, else its first."""
    later = [t["bare"] for t in program.get("timed_again", ())]
    return next((bare for bare in reversed(later) if all(v in bare for v in variants)), program["bare"])


def predict_third(row: ThirdRow, *, measured_bare: bool = True) -> dict:
    """A third-party row: its trace as ``proflab run`` recorded it before the fix, against the
    saving measured bare between the two variants (ms per step)."""
    import proflab

    folder = THIRD / row.folder if row.folder else THIRD
    bare = _timing(third_truth(folder)[row.program], row.base, row.fix)
    before, after = bare[row.base]["gpu_step_ms"], bare[row.fix]["gpu_step_ms"]
    measured, ci = _saving(before, after)
    base = bare[row.base]["median_ms"]
    stem = f"{row.program}.{row.base}"  # (record_thirdparty's run names)
    run = next((d for d in (folder / f"{stem}.shapes", folder / stem) if d.is_dir()), folder / stem)
    report = proflab.analyze(proflab.load(run / "traces" / f"{run.name}.pt.trace.json.xz"),
                             bare_step_ms=base if measured_bare else None)  # fmt: skip
    gain, source, rng = _finding_gain(report, row.finding, row.part)
    return _row(row.label, row.half, source, base, measured, ci, gain, rng)


def gen_truth(folder: Path = INFERENCE) -> dict:
    return {c["case"]: c for c in json.loads((folder / "truth.json").read_text())["cases"]}


def predict_gen(row: GenRow) -> dict:
    """A ``generate()`` row, per output token: the finding's gain against the bare TPOT saving."""
    import proflab

    t = gen_truth(row.folder)
    before, after = (t[f"{row.case}{v}-b{row.batch}"] for v in (row.base, row.fix))
    itl = [[x for r in case["bare_runs"] for x in r["itl_ms"]] for case in (before, after)]
    measured, ci = _saving(*itl)
    base = statistics.median(itl[0])
    report = proflab.analyze(proflab.load(_committed(row.folder, f"{row.case}{row.base}-b{row.batch}")))
    gain, source, rng = _finding_gain(report, row.finding)
    f = next((f for f in report.findings if f.id == row.finding), None)
    if f is not None and (f.prediction or {}).get("per") == "generation":
        decode = int(f.evidence.get("forwards") or before["new_tokens"] - 1)
        gain, rng = gain / decode, tuple(x / decode for x in rng)
    elif f is not None and report.summary.get("gain_per") != "step":
        raise ValueError(f"{row.label}: the report's gains are not per token")
    return _row(row.label, row.half, source, base, measured, ci, gain, rng)


def all_rows(*, measured_bare: bool = True, half: str | None = None) -> list[dict]:
    """Every row of the table (``half``: only the tune or the report half's)."""
    out = []
    if half != "report":  # the team's programs and the two-GPU jobs are all tune rows
        out += [predict(row, measured_bare=measured_bare) for row in ROWS]
        out += [predict_job(b, a, f, measured_bare=measured_bare) for b, a, f, _ in JOB_ROWS]
    out += [predict_third(row, measured_bare=measured_bare) for row in THIRD_ROWS if half in (None, row.half)]
    return out + [predict_gen(row) for row in GEN_ROWS if half in (None, row.half)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--estimated", action="store_true", help="analyse without the measured bare step")
    ap.add_argument("--half", choices=("tune", "report"), help="only this half's rows")
    args = ap.parse_args(argv)
    results = all_rows(measured_bare=not args.estimated, half=args.half)
    for half in (args.half,) if args.half else ("tune", "report"):
        rows = [r for r in results if r["half"] == half]
        print(f"\n{half} half\n")
        print("| program / fix | finding | bare ms | measured ms (95% CI) | predicted ms (range) | error (% of step) | within |")
        print("|---|---|---:|---:|---:|---:|---|")
        for r in rows:
            lo, hi = r["measured_ci95_ms"]
            print(f"| {r['row']} | {r['finding']} | {r['bare_ms']:.2f} | {r['measured_ms']:.2f} ({lo:.2f} to {hi:.2f}) | "
                  f"{r['predicted_ms']:.2f} ({r['predicted_range_ms'][0]:.2f}-{r['predicted_range_ms'][1]:.2f}) | "
                  f"{r['error_pct_of_step']:+.1f} | {'yes' if r['within'] else 'NO'} |")
        print(f"\n{half}: {sum(r['within'] for r in rows)} of {len(rows)} within the target")
    print(f"\nall: {sum(r['within'] for r in results)} of {len(results)} within the target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
