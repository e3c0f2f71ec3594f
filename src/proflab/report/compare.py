"""Before/after: what changed between two runs of a program, and whether it is real.

Two runs of an unchanged program differ: on an H100 one bf16 LM's GPU-side steps were
18.4-19.4 ms in one run and 19.3-22.0 ms in the next. The verdict follows an interval of the
change in median step time, the steps of one run being one sample and the runs of a side
replicates:

- each side's step time is its runs' medians averaged (on a log scale, so the change is a
  ratio); a run's median is uncertain by its steps' spread over the square root of their
  count (``pi/2 x s^2 / n``, the variance of a median), so the interval narrows with steps;
- runs of one program differ by more than their steps show (clocks, thermals, the host's CPU
  state, other tenants). With several runs on a side, that **between-run variation** is
  estimated from them (the spread of their medians, whose variance over the runs is the side's
  own), and the interval narrows with runs and takes Student's t of their degrees of freedom;
  a side of one run borrows the other side's estimate where it has one. Where neither side has
  two runs it cannot be measured: it is *assumed*, and said so, from repeats recorded on an
  H100 (``tests/data/repeats``): a run's median moves ``GPU_DRIFT_PCT`` (0.19 %, a GPU-bound
  LM) plus ``HOST_DRIFT_PCT`` (20 %, the host time of a host-bound loop) of the host's share
  of the step (the part the GPU was not busy), as standard deviations between processes.

A change is real (improved / regressed) when that interval excludes zero and the change is at
least the **noise floor**, the smallest change worth reporting: ``NOISE_FLOOR_PCT`` (5 %) or
``--threshold``. (The floor once also took one run's p10-p90 step spread, which is how widely
steps spread, not how uncertain a median is: a clear -91 % change of a loop whose steps spread
widely was called noise.) Three runs of two loops are few: record more and revise the
constants.

Everything here is computed from the two sides' analysis contexts (their models, through
:func:`trace_part`) and reports; per-step quantities are means over the GPU-side steps, so
the parts of the breakdown add up to the mean step. Times are ms per step unless a name says otherwise; with
no profiler steps on either side they are totals over the analysed window (``per`` says).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from proflab.analysis.context import Context
from proflab.analysis.timeline.gaps import CAUSES
from proflab.analysis.timeline.kernels import kernel_label
from proflab.readers import load_trace as _load
from proflab.readers.budget import DEFAULT_BUDGET
from proflab.report import Report

__all__ = [
    "SCHEMA_ID", "NOISE_FLOOR_PCT", "CONFIDENCE", "MIN_STEPS", "MIN_RUNS", "VERDICTS",
    "Side", "TracePart", "trace_part", "combined_part", "encode_part", "decode_part", "Comparison", "compare", "compare_runs", "normalize_kernel", "bootstrap_ratio_ci", "bootstrap_mean_diff_ci", "step_spread_pct", "median_change",
]  # fmt: skip

SCHEMA_ID = "proflab.compare/1"
NOISE_FLOOR_PCT = 5.0
CONFIDENCE = 0.95
BOOTSTRAP_N = 4000
MIN_STEPS = 3  # fewer per side and no interval can be given
MIN_RUNS = 3  # fewer a side and the between-run variation is not measured: the verdict has low confidence
# Between-run variation assumed where no side has two runs: standard deviations (%, of a run's
# median step) between processes of one unchanged program on an H100 (tests/data/repeats, three
# runs each): 0.19 % of the GPU-bound LM's median (22.93, 22.92, 22.85 ms), 20 % of the
# host-bound loop's host time (11.4, 9.2, 7.6 ms per step; its median, 92 % host: 18.7 %).
# A run's median is taken to move GPU_DRIFT_PCT plus HOST_DRIFT_PCT of the host's share.
GPU_DRIFT_PCT = 0.19
HOST_DRIFT_PCT = 20.0
VERDICTS = ("improved", "regressed", "no_change", "unknown")
_PARTS = ("compute", "communication", "memcpy", "memset")


@dataclass(frozen=True)
class Side:
    """One side of a comparison: the reports of its traces and what the comparison takes from
    each trace (:class:`TracePart`, from its context); for a run directory also its
    ``meta.json`` and monitor samples."""

    label: str
    reports: tuple[Report, ...]
    parts: tuple[TracePart, ...]
    run: dict[str, Any] | None = None
    monitor: pl.DataFrame | None = None


@dataclass(frozen=True)
class TracePart:
    """What a comparison needs of one trace: a few small tables, summed per name or per step,
    so that comparing traces analysed before is answered from the report cache
    (``report.cache``) without reading them. ``trace`` is kept only where the energy of a run
    directory needs it."""

    steps: pl.DataFrame | None  # per step and device: dur_ns, GPU parts, idle by cause; None: no steps
    gpu_steps: int  # GPU-side step rows (all step rows when the trace has no GPU-side steps)
    kernels_in_steps: pl.DataFrame  # name, ns, count: kernels that start inside a GPU-side step
    kernels: pl.DataFrame  # the same over the whole window
    op_gpu_in_steps: pl.DataFrame  # name, gpu_ns: GPU time by launching operator, inside steps
    op_gpu: pl.DataFrame
    op_host_in_steps: pl.DataFrame  # name, host_ns: cpu_op host time, starting inside host steps
    op_host: pl.DataFrame
    ranges: pl.DataFrame  # name, gpu_ns, host_ns
    with_stack: bool | None = None  # None: not a Kineto trace (its settings are not compared)
    record_shapes: bool | None = None
    trace: Any = None


PART_FRAMES = ("steps", "kernels_in_steps", "kernels", "op_gpu_in_steps", "op_gpu", "op_host_in_steps", "op_host", "ranges")


def trace_part(ctx: Context, *, keep_trace: bool = False) -> TracePart:
    """The comparison's tables of one trace (see :class:`TracePart`)."""
    st = ctx.step_table
    has_gpu = ctx.trace.has_gpu
    gpu_side = st.height and "gpu" in st["side"].cast(pl.String).to_list()
    gs = st.filter(pl.col("side").cast(pl.String) == "gpu") if gpu_side else st
    steps = None
    if st.height:
        rows = gs
        if has_gpu:
            g = ctx.gaps.filter(pl.col("step").is_not_null())
            causes = (
                g.with_columns(pl.col("cause").cast(pl.String))
                .group_by("step", "device")
                .agg([pl.col("dur_ns").filter(pl.col("cause") == c).sum().alias(f"idle_{c}_ns") for c in CAUSES])
            )
            rows = rows.join(causes, on=["step", "device"], how="left").with_columns(
                pl.col(f"idle_{c}_ns").fill_null(0) for c in CAUSES
            )
        # a trace with no GPU activity has no GPU parts at all: missing, not zero
        gpu_cols = ("busy_ns", *(f"{p}_ns" for p in _PARTS), "idle_ns", *(f"idle_{c}_ns" for c in CAUSES)) if has_gpu else ()
        steps = rows.select([c for c in ("step", "device", "dur_ns", *gpu_cols) if c in rows.columns])
    # the gaps are read: freed before the kernel rows are built again (report assembly freed
    # those), so the two never sit together (the 1 GB export's 2.2 M gaps: 148 MiB)
    ctx.drop("gaps")
    k = ctx.kernel_rows.select("name", "op", "start_ns", "dur_ns") if has_gpu else None
    k_in = _in_steps(k, gs, "start_ns") if k is not None else None
    cpu = ctx.trace.cpu.lazy().filter(pl.col("cat") == "cpu_op").select("name", "start_ns", "dur_ns").collect()
    host_steps = ctx.trace.steps.select("start_ns", (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"))
    rt = ctx.range_table
    ranges = (
        rt.group_by("name").agg(pl.col("gpu_ns").sum(), pl.col("host_ns").sum())
        if rt.height
        else pl.DataFrame(schema={"name": pl.String, "gpu_ns": pl.Int64, "host_ns": pl.Int64})
    )
    m, allcpu = ctx.trace.meta, ctx.trace.cpu
    stack = shapes = None
    if m.format == "kineto":
        stack = m.with_stack if m.with_stack is not None else bool((allcpu["cat"] == "python_function").any())
        ops = allcpu.filter(pl.col("cat") == "cpu_op")
        has_shapes = bool(ops.height and "input_types" in ops.columns and ops["input_types"].null_count() < ops.height)
        shapes = m.record_shapes if m.record_shapes is not None else has_shapes
    return TracePart(
        steps=steps,
        gpu_steps=gs.height,
        kernels_in_steps=_by_kernel(k_in),
        kernels=_by_kernel(k),
        op_gpu_in_steps=_by_op(k_in),
        op_gpu=_by_op(k),
        op_host_in_steps=_by_host(_in_steps(cpu, host_steps, "start_ns")),
        op_host=_by_host(cpu),
        ranges=ranges,
        with_stack=stack,
        record_shapes=shapes,
        trace=ctx.trace if keep_trace else None,
    )


def combined_part(parts: list[TracePart]) -> TracePart:
    """The comparison's tables of a trace analysed in consecutive parts (``report.combine``)
    from each part's: step rows together (each step is whole in one part), kernels, operators
    and ranges summed by name."""
    if len(parts) == 1:
        return parts[0]
    steps = [p.steps for p in parts if p.steps is not None and p.steps.height]
    summed = {}
    for name, keys in (("kernels_in_steps", ("ns", "count")), ("kernels", ("ns", "count")), ("op_gpu_in_steps", ("gpu_ns",)),
                       ("op_gpu", ("gpu_ns",)), ("op_host_in_steps", ("host_ns",)), ("op_host", ("host_ns",)),
                       ("ranges", ("gpu_ns", "host_ns"))):
        frames = [getattr(p, name) for p in parts]
        schema = frames[0].schema
        summed[name] = pl.concat(frames, how="vertical_relaxed").group_by("name").agg(pl.col(list(keys)).sum()).select(list(schema)).cast(schema)
    first = parts[0]
    return TracePart(
        steps=pl.concat(steps, how="diagonal_relaxed").sort("device", "step") if steps else next((p.steps for p in parts if p.steps is not None), None),
        gpu_steps=sum(p.gpu_steps for p in parts),
        **summed,
        with_stack=first.with_stack,
        record_shapes=first.record_shapes,
    )


def encode_part(part: TracePart) -> dict[str, Any]:
    """``part`` as JSON values for the report cache: each table as Arrow IPC (base64), which
    keeps its types exactly."""
    import base64
    import io

    frames = {}
    for name in PART_FRAMES:
        df = getattr(part, name)
        if df is not None:
            buf = io.BytesIO()
            df.write_ipc(buf)
            frames[name] = base64.b64encode(buf.getvalue()).decode("ascii")
    return {"frames": frames, "gpu_steps": part.gpu_steps, "with_stack": part.with_stack, "record_shapes": part.record_shapes}


def decode_part(d: dict[str, Any]) -> TracePart:
    """The inverse of :func:`encode_part` (raises on anything damaged)."""
    import base64
    import io

    frames = {name: (pl.read_ipc(io.BytesIO(base64.b64decode(d["frames"][name]))) if name in d["frames"] else None)
              for name in PART_FRAMES}
    if any(frames[n] is None for n in PART_FRAMES if n != "steps"):
        raise ValueError("a table is missing")
    return TracePart(**frames, gpu_steps=int(d["gpu_steps"]), with_stack=d["with_stack"], record_shapes=d["record_shapes"])


def _by_kernel(df: pl.DataFrame | None) -> pl.DataFrame:
    if df is None or not df.height:
        return pl.DataFrame(schema={"name": pl.String, "ns": pl.Int64, "count": pl.UInt32})
    return df.group_by("name").agg(pl.col("dur_ns").sum().alias("ns"), pl.len().alias("count"))


def _by_op(df: pl.DataFrame | None) -> pl.DataFrame:
    if df is None or not df.height:
        return pl.DataFrame(schema={"name": pl.String, "gpu_ns": pl.Int64})
    return df.group_by(pl.col("op").fill_null("(no operator)").alias("name")).agg(pl.col("dur_ns").sum().alias("gpu_ns"))


def _by_host(df: pl.DataFrame) -> pl.DataFrame:
    if not df.height:
        return pl.DataFrame(schema={"name": pl.String, "host_ns": pl.Int64})
    return df.group_by("name").agg(pl.col("dur_ns").sum().alias("host_ns"))


# -- names -------------------------------------------------------------------------------
# an integer that is a token of its own (a template argument, a block size, a compile-order
# suffix such as triton_poi_fused_add_0); digits inside words (f32, bf16, 128x64) stay
_BARE_INT = re.compile(r"(?<![A-Za-z0-9.])\d+(?![A-Za-z0-9])")


def normalize_kernel(name: str | None) -> str:
    """The name two runs' instances of one kernel share: no return type, namespaces or
    parameter list, and integers that stand alone (template arguments such as vector widths
    and block sizes, a Triton kernel's compile-order suffix) as ``#``. Precisions and tile
    shapes written inside words (``f32``, ``bf16``, ``128x128x64``) are kept: they tell
    kernels apart that a change swaps."""
    if not name:
        return "-"
    return _BARE_INT.sub("#", kernel_label(name)) or str(name)


# -- statistics ------------------------------------------------------------------------------
def bootstrap_ratio_ci(x: np.ndarray, y: np.ndarray, *, gx: np.ndarray | None = None, gy: np.ndarray | None = None,
                       level: float = CONFIDENCE, n: int = BOOTSTRAP_N, seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap interval of ``median(y) / median(x) - 1`` in %, resampling each
    side on its own (the steps of two runs are independent). A side whose values come from
    several runs (``gx``/``gy``: the run of each value, two runs or more) is resampled in two
    stages, runs and then steps within them, so drift between runs widens the interval as it
    should. Fixed seed: the same inputs give the same interval. None when either side has
    fewer than MIN_STEPS values."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.size < MIN_STEPS or y.size < MIN_STEPS:
        return None
    rng = np.random.default_rng(seed)
    mx, my = _boot_medians(x, gx, rng, n), _boot_medians(y, gy, rng, n)
    ratio = (my / mx - 1.0) * 100.0
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(ratio, [a, 1.0 - a])
    return float(lo), float(hi)


def _boot_medians(v: np.ndarray, groups: np.ndarray | None, rng: np.random.Generator, n: int) -> np.ndarray:
    runs = None if groups is None else [v[groups == g] for g in np.unique(groups)]
    if runs is None or len(runs) < 2:
        return np.median(v[rng.integers(0, v.size, (n, v.size))], axis=1)
    out = np.empty(n)
    for i in range(n):  # runs, then steps within each: a few thousand small draws
        pick = rng.integers(0, len(runs), len(runs))
        out[i] = np.median(np.concatenate([r[rng.integers(0, r.size, r.size)] for r in (runs[j] for j in pick)]))
    return out


def median_change(x: np.ndarray, y: np.ndarray, gx: np.ndarray | None = None, gy: np.ndarray | None = None, *,
                  assumed_pct: tuple[float, float] = (0.0, 0.0), level: float = CONFIDENCE) -> dict[str, Any]:
    """The change in median step time from ``x`` to ``y`` (each side's steps; ``gx``/``gy``
    the run of each step, None: one run) and its interval (see the module doc): the point
    is the ratio of the sides' run medians averaged on a log scale, in %; its variance the
    sum of the sides'. A side of several runs: the variance of its run medians over their
    count (Student's t with their degrees of freedom, Welch-Satterthwaite over both sides). A
    side of one run: its median's variance from its steps (``pi/2 x s^2 / n``, ``s`` the
    spread of their logs) plus a between-run variance, the other side's where it has runs,
    else ``assumed_pct`` (before, after; a standard deviation in % of the median), said in
    ``between_runs``. ``ci_pct`` is None with fewer than MIN_STEPS steps on a side."""
    sides = []
    for v, g in ((x, gx), (y, gy)):
        v = np.asarray(v, dtype=float)
        g = np.zeros(v.size, dtype=int) if g is None else np.asarray(g)
        ok = v > 0
        v, g = v[ok], g[ok]
        runs = [np.log(v[g == k]) for k in np.unique(g)]
        sides.append((v, [r for r in runs if r.size]))
    (vx, rx), (vy, ry) = sides
    out: dict[str, Any] = {"before": None, "after": None, "delta_pct": None, "ci_pct": None,
                           "steps_before": int(vx.size), "steps_after": int(vy.size),
                           "runs_before": len(rx), "runs_after": len(ry)}  # fmt: skip
    if not rx or not ry:
        return out
    mx, my = (float(np.mean([np.median(r) for r in runs])) for runs in (rx, ry))
    out |= {"before": _r(np.exp(mx)), "after": _r(np.exp(my)), "delta_pct": _r((np.exp(my - mx) - 1) * 100, 2)}
    if vx.size < MIN_STEPS or vy.size < MIN_STEPS:
        return out

    def within(runs: list[np.ndarray]) -> float:
        """Mean over runs of their medians' variance, from the steps (pooled spread of logs)."""
        dev = np.concatenate([r - np.mean(r) for r in runs])
        dof = sum(r.size - 1 for r in runs)
        s2 = float(dev @ dev / dof) if dof > 0 else 0.0
        return float(np.mean([np.pi / 2 * s2 / r.size for r in runs]))

    def between(runs: list[np.ndarray]) -> float | None:
        """The variance of a run's median between runs (its steps' share included), or None."""
        return float(np.var([np.median(r) for r in runs], ddof=1)) if len(runs) >= 2 else None

    bx, by = between(rx), between(ry)
    parts, said = [], []
    for tag, runs, own, other, assumed in (("before", rx, bx, by, assumed_pct[0]), ("after", ry, by, bx, assumed_pct[1])):
        if own is not None:
            parts.append((own / len(runs), len(runs) - 1))
            said.append(f"{_sd(own)} % between the {tag} side's {len(runs)} runs")
        elif other is not None:
            # one run: its steps' uncertainty and the other side's between-run variation
            ref = rx if tag == "after" else ry
            tau2 = max(other - within(ref), 0.0)
            parts += [(within(runs), np.inf), (tau2, len(ref) - 1)]
            said.append(f"the {tag} side's one run taken to vary as much")
        else:
            parts += [(within(runs), np.inf), ((assumed / 100) ** 2, np.inf)]
    if bx is None and by is None:
        said = [f"one run a side: between-run variation not measured, {assumed_pct[0]:.2g} % before and {assumed_pct[1]:.2g} % "
                "after assumed from recorded repeats"]
    var = sum(p for p, _ in parts)
    dof_terms = sum(p * p / d for p, d in parts if np.isfinite(d) and d > 0 and p > 0)
    df = var * var / dof_terms if dof_terms > 0 else np.inf
    q = _t_quantile(0.5 + level / 2, df)
    half = q * np.sqrt(var)
    d = my - mx
    lo, hi = (np.exp(d - half) - 1) * 100, (np.exp(d + half) - 1) * 100
    out |= {"ci_pct": [_r(lo, 2), _r(hi, 2)], "df": None if not np.isfinite(df) else _r(df, 1),
            "between_runs": "; ".join(said)}
    return out


def _sd(var_log: float) -> str:
    """A variance of log step times as a standard deviation in % of the median, 2 digits."""
    return f"{np.sqrt(var_log) * 100:.2g}"


def _t_quantile(p: float, df: float) -> float:
    """Student's t quantile (``df`` may be fractional; inf: the normal's), by bisection of its
    distribution function (the regularised incomplete beta)."""
    from math import erf, sqrt

    if not np.isfinite(df) or df > 1e6:
        cdf = lambda t: 0.5 * (1 + erf(t / sqrt(2)))  # noqa: E731
    else:
        cdf = lambda t: 1 - 0.5 * _betainc(df / 2, 0.5, df / (df + t * t)) if t >= 0 else 0.5 * _betainc(df / 2, 0.5, df / (df + t * t))  # noqa: E731
    lo, hi = -1e4, 1e4
    for _ in range(200):
        mid = (lo + hi) / 2
        if cdf(mid) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b) (a continued fraction, Lentz)."""
    from math import exp, lgamma, log

    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _betainc(b, a, 1.0 - x)
    front = exp(lgamma(a + b) - lgamma(a) - lgamma(b) + a * log(x) + b * log(1 - x)) / a
    tiny = 1e-300
    f, c, d = 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2 == 0:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            num = -((a + m) * (a + b + m) * x) / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + num * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + num / c
        c = c if abs(c) > tiny else tiny
        f *= c * d
        if abs(1.0 - c * d) < 1e-12:
            break
    return front * (f - 1.0)


def step_spread_pct(v: np.ndarray) -> float | None:
    """How widely a run's steps spread: (p90 - p10) / median, in %. None below MIN_STEPS."""
    v = np.asarray(v, dtype=float)
    if v.size < MIN_STEPS or np.median(v) <= 0:
        return None
    p10, p90 = np.percentile(v, [10, 90])
    return float((p90 - p10) / np.median(v) * 100.0)


def bootstrap_mean_diff_ci(x: np.ndarray, y: np.ndarray, *, level: float = CONFIDENCE, n: int = BOOTSTRAP_N,
                           seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap interval of ``mean(y) - mean(x)`` (the unit of the samples);
    None with fewer than MIN_STEPS values on a side."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.size < MIN_STEPS or y.size < MIN_STEPS:
        return None
    rng = np.random.default_rng(seed)
    d = y[rng.integers(0, y.size, (n, y.size))].mean(axis=1) - x[rng.integers(0, x.size, (n, x.size))].mean(axis=1)
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(d, [a, 1.0 - a])
    return float(lo), float(hi)


def _change(x: np.ndarray, y: np.ndarray, gx: np.ndarray | None = None, gy: np.ndarray | None = None) -> dict[str, Any]:
    """Medians before/after (ms), the change in % and its interval."""
    bx = float(np.median(x)) if x.size else None
    ay = float(np.median(y)) if y.size else None
    delta = None if not bx or ay is None else (ay / bx - 1.0) * 100.0
    ci = bootstrap_ratio_ci(x, y, gx=gx, gy=gy)
    return {
        "before": _r(bx), "after": _r(ay), "delta_pct": _r(delta, 2),
        "ci_pct": None if ci is None else [_r(ci[0], 2), _r(ci[1], 2)],
        "steps_before": int(x.size), "steps_after": int(y.size),
    }  # fmt: skip


def _r(v: float | None, nd: int = 3) -> float | None:
    return None if v is None else round(float(v), nd)


# -- per side tables ---------------------------------------------------------------------------
def _step_rows(side: Side) -> pl.DataFrame:
    """One row per step and device over all of a side's traces: duration and its parts
    (ns), idle by cause. GPU-side steps where a trace has them, its host ranges otherwise."""
    frames = [
        part.steps.with_columns(pl.lit(i, dtype=pl.Int32).alias("trace"))
        for i, part in enumerate(side.parts)
        if part.steps is not None
    ]
    if not frames:
        return pl.DataFrame(schema={"trace": pl.Int32, "step": pl.Int64, "dur_ns": pl.Int64})
    return pl.concat(frames, how="diagonal_relaxed")


def _in_steps(df: pl.DataFrame, steps: pl.DataFrame, time_col: str) -> pl.DataFrame:
    """Rows of ``df`` (one trace) whose ``time_col`` falls inside one of its GPU-side steps."""
    if steps.height == 0 or df.height == 0:
        return df
    spans = steps.select("start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns")).sort("start_ns")
    lo, hi = spans["start_ns"].to_numpy(), spans["end_ns"].to_numpy()
    hi = np.maximum.accumulate(hi)  # overlapping windows of several devices
    t = df[time_col].to_numpy()
    k = np.searchsorted(lo, t, side="right") - 1
    inside = (k >= 0) & (t < hi[np.maximum(k, 0)])
    return df.filter(pl.Series(inside))


@dataclass
class _Totals:
    kernels: pl.DataFrame  # name, raw, ns, count
    ops: pl.DataFrame  # name, gpu_ns, host_ns
    ranges: pl.DataFrame  # name, gpu_ns, host_ns
    per_n: int  # what totals are divided by: step rows, or 1 for the window


def _totals(side: Side, per_step: bool) -> _Totals:
    kernels, ops, ranges, n = [], [], [], 0
    for part in side.parts:
        if per_step:
            n += part.gpu_steps
        k = part.kernels_in_steps if per_step else part.kernels
        if k.height:
            kernels.append(k)
            ops.append(part.op_gpu_in_steps if per_step else part.op_gpu)
        host = part.op_host_in_steps if per_step else part.op_host
        if host.height:
            ops.append(host)
        if part.ranges.height:
            ranges.append(part.ranges)
    per_n = max(n, 1) if per_step else 1

    def cat(frames, schema):
        return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame(schema=schema)

    k = cat(kernels, {"name": pl.String, "ns": pl.Int64, "count": pl.UInt32})
    if k.height:
        names = k["name"].unique()
        norm = pl.DataFrame({"name": names, "key": [normalize_kernel(s) for s in names.to_list()]})
        k = (
            k.join(norm, on="name")
            .group_by("key")
            .agg(pl.col("ns").sum(), pl.col("count").sum(), pl.col("name").sort_by("ns", descending=True).first().alias("raw"),
                 pl.col("name").n_unique().alias("variants"))
        )
    else:
        k = pl.DataFrame(schema={"key": pl.String, "ns": pl.Int64, "count": pl.UInt32, "raw": pl.String, "variants": pl.UInt32})
    o = cat(ops, {"name": pl.String, "gpu_ns": pl.Int64, "host_ns": pl.Int64})
    o = o.group_by("name").agg(pl.col(c).sum() if c in o.columns else pl.lit(0).alias(c) for c in ("gpu_ns", "host_ns")) if o.height else o
    r = cat(ranges, {"name": pl.String, "gpu_ns": pl.Int64, "host_ns": pl.Int64})
    r = r.group_by("name").agg(pl.col("gpu_ns").sum(), pl.col("host_ns").sum()) if r.height else r
    return _Totals(k, o, r, per_n)


def _status(cols: tuple[str, ...]) -> pl.Expr:
    """new: nothing before; vanished: nothing after; matched: some of it on both sides."""
    before = pl.sum_horizontal(pl.col(f"before_{c}").abs() for c in cols)
    after = pl.sum_horizontal(pl.col(f"after_{c}").abs() for c in cols)
    return pl.when(before == 0).then(pl.lit("new")).when(after == 0).then(pl.lit("vanished")).otherwise(pl.lit("matched"))


def _delta_table(b: pl.DataFrame, a: pl.DataFrame, key: str, cols: tuple[str, ...], nb: int, na: int) -> pl.DataFrame:
    """Outer join of two sides' totals on ``key``: ``before_<c>_ms``/``after_<c>_ms``/
    ``delta_<c>_ms`` per column (totals divided by each side's step count)."""
    if b.height == 0 and a.height == 0:
        return pl.DataFrame(schema={"name": pl.String, "status": pl.String})
    sel = lambda d, tag, n: d.select(key, *(pl.col(c).cast(pl.Float64).truediv(n * 1e6).alias(f"{tag}_{c}") for c in cols))  # noqa: E731
    j = sel(b, "before", nb).join(sel(a, "after", na), on=key, how="full", coalesce=True)
    j = j.with_columns(pl.col(f"{t}_{c}").fill_null(0.0) for t in ("before", "after") for c in cols)
    j = j.with_columns((pl.col(f"after_{c}") - pl.col(f"before_{c}")).alias(f"delta_{c}") for c in cols)
    return (
        j.with_columns(_status(cols).alias("status"))
        .sort(pl.sum_horizontal(pl.col(f"delta_{c}").abs() for c in cols), key, descending=[True, False])
        .rename({key: "name"} | {f"{t}_{c}": f"{t}_{c.removesuffix('_ns')}_ms" for t in ("before", "after", "delta") for c in cols})
    )


# -- the comparison ---------------------------------------------------------------------------
@dataclass
class Comparison:
    """Two sides and what changed between them. Tables are polars DataFrames (ms per step);
    ``to_dict`` is the ``proflab.compare/1`` contract (``schema/compare.schema.json``)."""

    before: Side
    after: Side
    floor_pct: float = NOISE_FLOOR_PCT
    floor_source: str = "default"
    notes: list[str] = field(default_factory=list)
    # measured unprofiled step times (ms) of each side, when the caller has them: the verdict
    # then rests on them rather than on the profiled steps (the profiler can mask a change)
    unprofiled_steps_ms: tuple[list[float], list[float]] | None = None
    # how a notebook shows it (``_repr_html_``): a renderer's work (render.markdown), which sits
    # above this layer, so the caller that has one hands it in (``proflab.compare`` does)
    html_view: Callable[[Comparison], str] | None = field(default=None, repr=False, compare=False)

    # -- step time -------------------------------------------------------------------------
    @cached_property
    def _steps(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        return _step_rows(self.before), _step_rows(self.after)

    @property
    def per(self) -> str:
        """``step`` when both sides have profiler steps, else ``window``."""
        b, a = self._steps
        return "step" if b.height and a.height else "window"

    @cached_property
    def steps(self) -> pl.DataFrame:
        """Every step of both sides: side, trace, step, device, dur_ms and its parts."""
        out = []
        for tag, df in zip(("before", "after"), self._steps):
            if df.height:
                ns = [c for c in df.columns if c.endswith("_ns")]
                out.append(df.select(pl.lit(tag).alias("side"), "trace", "step", *(c for c in ("device",) if c in df.columns),
                                     *(pl.col(c).cast(pl.Float64).truediv(1e6).alias(c.removesuffix("_ns") + "_ms") for c in ns)))
        return pl.concat(out, how="diagonal_relaxed") if out else pl.DataFrame(schema={"side": pl.String, "dur_ms": pl.Float64})

    @cached_property
    def step_time(self) -> dict[str, Any]:
        """Median step (ms) before and after, change in % and its interval (``median_change``:
        several traces on a side are its runs; a run directory's traces, its ranks, one run)."""
        assumed = self.assumed_drift_pct
        if self.unprofiled_steps_ms is not None:
            x, y = (np.asarray(v, dtype=float) for v in self.unprofiled_steps_ms)
            return median_change(x, y, assumed_pct=assumed) | {"side": "unprofiled"}
        b, a = self._steps
        x = b["dur_ns"].to_numpy() / 1e6 if b.height else np.array([])
        y = a["dur_ns"].to_numpy() / 1e6 if a.height else np.array([])
        gx = None if not b.height or self.before.run is not None else b["trace"].to_numpy()
        gy = None if not a.height or self.after.run is not None else a["trace"].to_numpy()
        return median_change(x, y, gx, gy, assumed_pct=assumed) | {"side": self._side_name()}

    @cached_property
    def assumed_drift_pct(self) -> tuple[float, float]:
        """Per side, the between-run variation assumed where no side has two runs (a standard
        deviation, % of a run's median): GPU_DRIFT_PCT plus HOST_DRIFT_PCT of the host's share
        of the step (``host_share``; all of the step where it is unknown)."""
        return tuple(round(GPU_DRIFT_PCT + HOST_DRIFT_PCT * (1.0 if h is None else h), 2) for h in self.host_share)  # type: ignore[return-value]

    def _samples(self) -> tuple[np.ndarray, np.ndarray]:
        if self.unprofiled_steps_ms is not None:
            return tuple(np.asarray(v, dtype=float) for v in self.unprofiled_steps_ms)  # type: ignore[return-value]
        b, a = self._steps
        return (b["dur_ns"].to_numpy() / 1e6 if b.height else np.array([]), a["dur_ns"].to_numpy() / 1e6 if a.height else np.array([]))

    @cached_property
    def noise_floor(self) -> tuple[float, str]:
        """(floor %, where it comes from): the smallest change in step time worth reporting,
        NOISE_FLOOR_PCT or --threshold. Noise itself is in the interval (``step_time``)."""
        if self.floor_source == "--threshold":
            return self.floor_pct, "--threshold"
        return self.floor_pct, "the smallest change reported by default"

    @cached_property
    def host_share(self) -> tuple[float | None, float | None]:
        """Per side, the share of the median step the GPU was not busy (0-1): the part of the
        step that follows the host, and drifts with it between runs."""
        out = []
        for df, v in zip(self._steps, self._samples()):
            if "busy_ns" not in df.columns or df.height == 0 or v.size == 0 or np.median(v) <= 0:
                out.append(None)
                continue
            out.append(float(min(max(1.0 - float(df["busy_ns"].median()) / 1e6 / float(np.median(v)), 0.0), 1.0)))
        return out[0], out[1]

    @cached_property
    def gpu_work(self) -> dict[str, Any] | None:
        """GPU busy time per step (ms): what the GPU computed, whatever the host did."""
        b, a = self._steps
        if "busy_ns" not in b.columns or "busy_ns" not in a.columns:
            return None
        return _change(b["busy_ns"].to_numpy() / 1e6, a["busy_ns"].to_numpy() / 1e6)

    def _side_name(self) -> str | None:
        sides = {str(r.summary.get("step_side")) for s in (self.before, self.after) for r in s.reports if r.summary.get("step_side")}
        return None if not sides else (sides.pop() if len(sides) == 1 else "mixed")

    @cached_property
    def confidence(self) -> dict[str, Any]:
        """How far the verdict can be trusted, from how many runs a side holds: ``high`` with
        at least MIN_RUNS runs a side (the between-run variation is measured, with degrees of
        freedom to spare), ``low`` with fewer (it is assumed from recorded repeats, or taken
        from one or two run medians, whose interval is mostly Student's t of one degree of
        freedom: +-60 % of a ResNet step said nothing). ``why`` says it in words."""
        s = self.step_time
        rb, ra = s.get("runs_before", 0), s.get("runs_after", 0)
        level = "high" if min(rb, ra) >= MIN_RUNS else "low"
        runs = f"{rb} run{'s' if rb != 1 else ''} a side" if rb == ra else f"{rb} vs {ra} runs a side"
        why = (f"{runs}: the between-run variation is measured" if level == "high"
               else f"low confidence: {runs} (fewer than {MIN_RUNS} cannot measure how runs differ)")
        return {"level": level, "runs_before": int(rb), "runs_after": int(ra), "why": why}

    @cached_property
    def mechanisms(self) -> pl.DataFrame:
        """The parts of the step whose change is one mechanism across all runs: clear in every
        pair of runs (a before run against an after run, the part's per-step interval excluding
        0 the same way in each) and, in every pair, larger than how much that part moves
        between runs of an unchanged program (1.96 standard deviations of a difference: each
        side's spread of its run means where it has two runs or more, and at least what the
        recorded repeats show, ``GPU_DRIFT_PCT`` of a GPU part and ``HOST_DRIFT_PCT`` of an idle
        part, which follows the host). Idle parts are left out where the sides' profiler
        settings differ (the profiler's own host cost moves them). Columns: part, delta_ms (mean
        ms per step), run_pairs, least_ms (the smallest change over the pairs of runs), drift_ms
        (the bar each pair cleared)."""
        schema = {"part": pl.String, "delta_ms": pl.Float64, "run_pairs": pl.Int64, "least_ms": pl.Float64, "drift_ms": pl.Float64}
        b, a = self._steps
        if b.height == 0 or a.height == 0 or self.breakdown.height == 0:
            return pl.DataFrame(schema=schema)
        same_settings = _settings(self.before) == _settings(self.after)
        rows = []
        for r in self.breakdown.filter(pl.col("clear")).iter_rows(named=True):
            part = r["part"]
            idle = part.startswith("idle:")
            if idle and not same_settings:
                continue
            col = part.replace("idle:", "idle_") + "_ns"
            runs_b, runs_a = ([g[col].cast(pl.Float64).to_numpy() / 1e6 for _, g in df.group_by("trace", maintain_order=True)] for df in (b, a))
            drift = (HOST_DRIFT_PCT if idle else GPU_DRIFT_PCT) / 100

            def sd(runs: list[np.ndarray]) -> float:
                means = [float(v.mean()) for v in runs]
                measured = float(np.std(means, ddof=1)) if len(means) >= 2 else 0.0
                return max(measured, drift * float(np.mean(means)))

            bar = 1.96 * float(np.hypot(sd(runs_b), sd(runs_a)))
            sign = 1.0 if r["delta_ms"] > 0 else -1.0
            least = np.inf
            for x in runs_b:
                for y in runs_a:
                    ci = bootstrap_mean_diff_ci(x, y)
                    clear = ci is not None and (ci[0] > 0 if sign > 0 else ci[1] < 0)
                    least = min(least, sign * float(y.mean() - x.mean()) if clear else -np.inf)
            if least > bar:
                rows.append({"part": part, "delta_ms": r["delta_ms"], "run_pairs": len(runs_b) * len(runs_a),
                             "least_ms": sign * least, "drift_ms": bar})
        return pl.DataFrame(rows, schema=schema)

    @cached_property
    def _parts_case(self) -> tuple[dict[str, Any] | None, str]:
        """(the change the parts show, or None; why not, in words). See ``from_parts``."""
        s = self.step_time
        if s.get("side") == "unprofiled" or not s.get("before"):
            return None, ""  # measured timings have no parts of their own
        if max(s["runs_before"], s["runs_after"]) < 2:
            # one process a side: a part that moved may be that process's drift (a host-bound loop's
            # host time drifts 51 % between repeats), and a profiler's cost moves host idle with it
            return None, "one run a side cannot show a part changing in every run"
        before = s["before"]
        m = self.mechanisms.filter(pl.col("delta_ms").abs() >= self.floor_pct / 100 * before)
        if m.height == 0:
            return None, "no part moved by the noise floor the same way in every run, beyond how parts move between runs"
        said = ", ".join(f"{r['part']} {r['delta_ms']:+.2f} ms/step" for r in m.iter_rows(named=True))
        total = float(m["delta_ms"].sum())
        b, a = self._steps
        step_mean = float(a["dur_ns"].mean() - b["dur_ns"].mean()) / 1e6
        if len(set(np.sign(m["delta_ms"].to_numpy()).tolist())) != 1:
            return None, f"the parts that changed in every run point both ways ({said})"
        if abs(total) / before * 100 < self.floor_pct:
            return None, f"{said} changed in every run, less than the noise floor of the step together"
        if np.sign(s["delta_pct"]) != np.sign(total) or step_mean * np.sign(total) < 0.5 * abs(total):
            return None, (f"{said} changed in every run, but the step moved {step_mean:+.2f} ms on average, not half of it: "
                          "the rest of the step took it back")
        return {"delta_ms": _r(total), "step_mean_delta_ms": _r(step_mean), "parts": _rows(m)}, ""

    @property
    def from_parts(self) -> dict[str, Any] | None:
        """The change the parts show, where it can decide the verdict: parts of one mechanism
        across all runs (``mechanisms``), each at least the noise floor of the step, all one
        way, together at least the floor, and the step's own change the same way, its mean at
        least half of theirs (the rest of the step did not take it back). None otherwise.
        ``delta_ms``: the parts' sum; ``step_mean_delta_ms``: the mean step's change (ms per
        step)."""
        return self._parts_case[0]

    @cached_property
    def verdict(self) -> tuple[str, str]:
        """(verdict, why): improved / regressed when the step's change is clear and at least
        the noise floor, or, where its interval is not clear, when the parts show a change of
        one mechanism across all runs that accounts for it (``from_parts``); unknown when step
        time cannot be measured on a side. With fewer than MIN_RUNS runs a side an interval
        that includes 0 is not printed: the reason says how confident it is instead."""
        s = self.step_time
        if s["steps_before"] == 0 or s["steps_after"] == 0:
            which = " and ".join(t for t, k in (("before", "steps_before"), ("after", "steps_after")) if s[k] == 0)
            across = [t for t, side in (("before", self.before), ("after", self.after))
                      if any("profiler steps run across a cut" in n for r in side.reports for n in r.notes)]
            if across:  # (analysed in parts shorter than a step: the trace has steps, no part a whole one)
                return "unknown", (f"no whole profiler step in {' and '.join(across)}'s parts, each shorter than a step: step "
                                   "time cannot be compared; a --memory-budget that holds a few steps can")
            return "unknown", f"no profiler steps in {which}: step time cannot be compared"
        if s["ci_pct"] is None:
            return "unknown", f"{s['steps_before']} vs {s['steps_after']} steps: at least {MIN_STEPS} per side are needed to separate change from noise"
        d, (lo, hi) = s["delta_pct"], s["ci_pct"]
        clear = lo > 0 or hi < 0
        level = f"{CONFIDENCE:.0%}"
        runs = f"{s['runs_before']} vs {s['runs_after']} run{'s' if max(s['runs_before'], s['runs_after']) > 1 else ''}"
        interval = f"{level} interval [{lo:+.1f}, {hi:+.1f}] % ({s['steps_before']} vs {s['steps_after']} steps, {runs}; {s['between_runs']})"
        conf = self.confidence
        low = "" if conf["level"] == "high" else f"; {conf['why']}"
        floor, src = self.noise_floor
        if not clear:
            p, why_not = self._parts_case
            if p is not None:
                kind = "improved" if p["delta_ms"] < 0 else "regressed"
                said = ", ".join(f"{r['part']} {r['delta_ms']:+.2f} ms/step" for r in p["parts"])
                pairs = p["parts"][0]["run_pairs"]
                return kind, (f"{d:+.1f} % from the parts: {said}, clear in every run ({pairs} pair{'s' if pairs > 1 else ''} of runs, "
                              f"{s['steps_before']} vs {s['steps_after']} steps) and beyond how much it moves between runs; "
                              f"{conf['why'] if conf['level'] == 'low' else conf['why'] + ', yet the step interval includes 0'} "
                              f"({s['between_runs']})")
            if conf["level"] == "low":
                # few run medians a side: an interval of Student's t with a degree of freedom or two, or of an
                # assumed drift, is wide and says little; how confident the verdict is, is what to say
                return "no_change", f"{d:+.1f} % is not clear ({conf['why']}; {s['between_runs']}): {why_not}"
            return "no_change", f"{d:+.1f} % is within noise: the {interval} includes 0"
        if abs(d) < floor:  # (the only place the floor is said, with where it comes from)
            return "no_change", f"{d:+.1f} % is clear, {interval}, but below the {floor:g} % noise floor ({src}){low}"
        kind = "improved" if d < 0 else "regressed"
        return kind, f"{d:+.1f} %, {interval}{low}"

    # -- where the time moved ---------------------------------------------------------------
    @cached_property
    def breakdown(self) -> pl.DataFrame:
        """Mean ms per step of each part (compute, communication, memcpy, memset, idle by
        cause) before and after, largest change first. Parts add up to the mean step."""
        b, a = self._steps
        parts = [f"{p}_ns" for p in _PARTS] + [f"idle_{c}_ns" for c in CAUSES]
        rows = []
        for c in parts:
            if c not in b.columns or c not in a.columns or b.height == 0 or a.height == 0:
                continue
            x, y = b[c].cast(pl.Float64).to_numpy() / 1e6, a[c].cast(pl.Float64).to_numpy() / 1e6
            ci = bootstrap_mean_diff_ci(x, y)
            rows.append({"part": c.removesuffix("_ns").replace("idle_", "idle:"), "before_ms": float(x.mean()), "after_ms": float(y.mean()),
                         "delta_ms": float(y.mean() - x.mean()), "ci_lo_ms": None if ci is None else ci[0],
                         "ci_hi_ms": None if ci is None else ci[1], "clear": ci is not None and (ci[0] > 0 or ci[1] < 0)})
        if not rows:
            return pl.DataFrame(schema={"part": pl.String, "before_ms": pl.Float64, "after_ms": pl.Float64, "delta_ms": pl.Float64,
                                        "ci_lo_ms": pl.Float64, "ci_hi_ms": pl.Float64, "clear": pl.Boolean})
        return pl.DataFrame(rows).sort(pl.col("delta_ms").abs(), descending=True)

    @cached_property
    def _totals(self) -> tuple[_Totals, _Totals]:
        per_step = self.per == "step"
        return _totals(self.before, per_step), _totals(self.after, per_step)

    @cached_property
    def kernels(self) -> pl.DataFrame:
        """Kernels matched by normalised name: ms per step before/after, delta, count per
        step, status (matched, new, vanished), largest change first."""
        tb, ta = self._totals
        t = _delta_table(tb.kernels.rename({"key": "k"}), ta.kernels.rename({"key": "k"}), "k", ("ns",), tb.per_n, ta.per_n)
        if t.height == 0:
            return pl.DataFrame(schema={"name": pl.String, "before_ms": pl.Float64, "after_ms": pl.Float64, "delta_ms": pl.Float64, "status": pl.String})
        raw = pl.concat([tb.kernels.select("key", "raw", "count"), ta.kernels.select("key", "raw", "count")], how="vertical_relaxed")
        counts = lambda d, n: d.select(pl.col("key").alias("name"), (pl.col("count") / n).alias("c"))  # noqa: E731
        t = (
            t.rename({"before_ns_ms": "before_ms", "after_ns_ms": "after_ms", "delta_ns_ms": "delta_ms"})
            .join(counts(tb.kernels, tb.per_n).rename({"c": "before_count"}), on="name", how="left")
            .join(counts(ta.kernels, ta.per_n).rename({"c": "after_count"}), on="name", how="left")
            .join(raw.group_by("key").agg(pl.col("raw").sort_by("count", descending=True).first()).rename({"key": "name"}), on="name", how="left")
        )
        return t.select("name", "before_ms", "after_ms", "delta_ms", "status", "before_count", "after_count", pl.col("raw").alias("example"))

    @cached_property
    def ops(self) -> pl.DataFrame:
        """Operators: GPU time of the kernels each launched and host time (ms per step; host
        time includes the operators nested inside, as the profiler records it)."""
        tb, ta = self._totals
        return _delta_table(tb.ops, ta.ops, "name", ("gpu_ns", "host_ns"), tb.per_n, ta.per_n)

    @cached_property
    def ranges(self) -> pl.DataFrame:
        """NVTX / record_function ranges: GPU time launched inside and host time, over the
        whole analysed window divided by the steps (ms per step)."""
        tb, ta = self._totals
        return _delta_table(tb.ranges, ta.ranges, "name", ("gpu_ns", "host_ns"), tb.per_n, ta.per_n)

    # -- findings --------------------------------------------------------------------------
    @cached_property
    def findings(self) -> pl.DataFrame:
        """Findings by id: resolved (before only), new (after only), persisting (both), with
        each side's estimated gain (ms over its window; the largest over its traces)."""
        def best(side: Side) -> dict[str, dict]:
            out: dict[str, dict] = {}
            for r in side.reports:
                for f in r.findings:
                    if f.category == "healthy":
                        continue
                    if f.id not in out or f.est_gain_pct > out[f.id]["est_gain_pct"]:
                        out[f.id] = {"id": f.id, "category": f.category, "severity": f.severity, "title": f.title,
                                     "est_gain_ms": f.est_gain_ms, "est_gain_pct": f.est_gain_pct}
            return out

        b, a = best(self.before), best(self.after)
        rows = []
        for fid in dict.fromkeys([*b, *a]):
            fb, fa = b.get(fid), a.get(fid)
            ref = fa or fb
            rows.append({
                "status": "persisting" if fb and fa else ("resolved" if fb else "new"),
                "id": fid, "category": ref["category"], "severity": ref["severity"], "title": ref["title"],
                "before_gain_pct": None if fb is None else round(fb["est_gain_pct"], 2),
                "after_gain_pct": None if fa is None else round(fa["est_gain_pct"], 2),
            })  # fmt: skip
        schema = {"status": pl.String, "id": pl.String, "category": pl.String, "severity": pl.String, "title": pl.String,
                  "before_gain_pct": pl.Float64, "after_gain_pct": pl.Float64}  # fmt: skip
        return pl.DataFrame(rows, schema=schema)

    # -- caveats and run directories -------------------------------------------------------------
    @cached_property
    def caveats(self) -> list[str]:
        out = list(self.notes)
        sb, sa = _settings(self.before), _settings(self.after)
        diff = [f"{k}: {_yn(sb[k])} -> {_yn(sa[k])}" for k in sb if sb[k] != sa[k]]
        if diff:
            out.append("profiler settings differ (" + ", ".join(diff) + "): the profiler's own host cost differs, so a "
                       "host-bound loop's step time changes with them; compare runs recorded alike")
        budgeted = [tag for tag, side in (("before", self.before), ("after", self.after))
                    if any(n.startswith("memory budget: reading") for r in side.reports for n in r.notes)]
        if budgeted:
            out.append(f"{' and '.join(budgeted)}: analysed in a part of the trace for the memory budget (the report's notes say "
                       "which); " + ("totals over parts of different spans do not compare: give both sides --memory-budget none "
                                     "or the same --window" if self.per == "window" else "per-step times compare the steps of the parts"))
        if self.per == "window":
            wb, wa = (sum(r.summary.get("wall_ms") or 0 for r in side.reports) for side in (self.before, self.after))
            out.append(f"no profiler steps on a side: kernel, operator and range times are totals over the analysed windows "
                       f"({wb:,.1f} ms before, {wa:,.1f} ms after), not per step")
        nb, na = (_device_names(s) for s in (self.before, self.after))
        if nb and na and nb != na:
            out.append(f"different GPUs: {', '.join(nb)} -> {', '.join(na)}")
        s = self.step_time
        if 0 < min(s["steps_before"], s["steps_after"]) < 10:
            out.append(f"{s['steps_before']} and {s['steps_after']} steps: a few steps give a wide interval and "
                       "cannot show small changes; record more active steps")
        if self.verdict[0] == "no_change" and self.breakdown.height:
            moved = self.breakdown.filter(pl.col("clear") & (pl.col("delta_ms").abs() >= self.floor_pct / 100 * (s["before"] or 0)))
            if moved.height:
                parts = ", ".join(f"{r['part']} {r['delta_ms']:+.2f} ms" for r in moved.head(3).iter_rows(named=True))
                out.append(f"step time did not clearly change, but per step {parts} did (clear, beyond the noise floor): "
                           "the change is real where it acted; whether the step gains needs more steps or unprofiled timings")
        infl = [o["inflation"][0] for side in (self.before, self.after) for r in side.reports
                if (o := r.summary.get("observer")) and o.get("inflation")]
        if infl and max(infl) >= 1.3:
            out.append(f"the profiler inflated GPU-side steps up to {max(infl):.1f}x (observer estimate): a change "
                       "to host overhead may be masked by the profiler's own cost; see unprofiled_step_ms")
        return out

    @cached_property
    def unprofiled_step_ms(self) -> dict[str, Any]:
        """Each side's step time without the profiler: measured when given, else the
        observer's estimate (a range), per trace."""
        def one(side: Side):
            return [{"trace": i, "source": o["source"], "range_ms": o["unprofiled_step_ms"]}
                    for i, r in enumerate(side.reports) if (o := r.summary.get("observer"))]
        return {"before": one(self.before), "after": one(self.after)}

    @cached_property
    def environment(self) -> pl.DataFrame:
        """What differs between the two sides' environments (run directories: GPU, driver,
        CUDA, torch, Python, proflab, mean SM clock, git commit; traces: the device)."""
        eb, ea = _environment(self.before), _environment(self.after)
        rows = [{"key": k, "before": eb.get(k), "after": ea.get(k), "differs": eb.get(k) != ea.get(k)} for k in dict.fromkeys([*eb, *ea])]
        return pl.DataFrame(rows, schema={"key": pl.String, "before": pl.String, "after": pl.String, "differs": pl.Boolean})

    @cached_property
    def energy(self) -> dict[str, Any] | None:
        """Energy per GPU-side step (J) when both sides are run directories with monitor
        samples: the NVML energy counter over each rank's profiled steps, summed over ranks
        (``analysis.energy``). A side whose steps span less than the counter's resolution gets
        null and ``refused`` says why (missing, not an estimate)."""
        eb, ea = _energy(self.before), _energy(self.after)
        if eb is None or ea is None:
            return None
        b, a = eb["energy_per_step_j"], ea["energy_per_step_j"]
        d = None if not b or a is None else (a / b - 1) * 100
        return {"before": eb, "after": ea, "delta_pct": _r(d, 2),
                "method": "NVML energy counter over the profiled GPU-side steps, per step, summed over ranks"}

    @cached_property
    def perf(self) -> dict[str, Any] | None:
        """Where the FLOPs go, before and after (``analysis.perf``): per operator class its
        achieved TFLOPS and GB/s (executed FLOPs and bytes over its kernels' time, summed over
        a side's traces) and its GPU ms per step; each side's median MFU. None when neither
        side's reports have the section."""
        sides = [[r.perf for r in s.reports if r.perf] for s in (self.before, self.after)]
        if not any(sides):
            return None

        def per_class(perfs: list[dict], steps: int) -> dict[str, dict[str, float | None]]:
            acc: dict[str, dict[str, float]] = {}
            for p in perfs:
                for c in p["classes"]:
                    a = acc.setdefault(c["class"], {"ms": 0.0, "f": 0.0, "f_ms": 0.0, "b": 0.0, "b_ms": 0.0})
                    a["ms"] += c["time_ms"] or 0.0
                    if c.get("achieved_tflops") is not None:
                        a["f"] += (c["achieved_tflops"] or 0.0) * 1e9 * (c["time_ms"] or 0.0)
                        a["f_ms"] += c["time_ms"] or 0.0
                    if c.get("achieved_gbps") is not None:
                        a["b"] += c["achieved_gbps"] * 1e6 * (c["time_ms"] or 0.0)
                        a["b_ms"] += c["time_ms"] or 0.0
            return {k: {"tflops": _r(a["f"] / a["f_ms"] / 1e9) if a["f_ms"] else None,
                        "gbps": _r(a["b"] / a["b_ms"] / 1e6, 1) if a["b_ms"] else None,
                        "ms_per_step": _r(a["ms"] / steps) if steps else None} for k, a in acc.items()}  # fmt: skip

        steps = [sum(int(r.summary.get("step_count") or 0) for r in s.reports if r.perf) for s in (self.before, self.after)]
        b, a = (per_class(p, n) for p, n in zip(sides, steps))
        rows = []
        for cls in dict.fromkeys([*b, *a]):
            x, y = b.get(cls, {}), a.get(cls, {})
            tb, ta = x.get("tflops"), y.get("tflops")
            rows.append({"class": cls, "before_tflops": tb, "after_tflops": ta,
                         "tflops_change_pct": _r((ta / tb - 1) * 100, 1) if tb and ta is not None else None,
                         "before_gbps": x.get("gbps"), "after_gbps": y.get("gbps"),
                         "before_ms_per_step": x.get("ms_per_step"), "after_ms_per_step": y.get("ms_per_step")})
        rows.sort(key=lambda r: -max(r["before_ms_per_step"] or 0, r["after_ms_per_step"] or 0))

        def mfu(perfs: list[dict]) -> float | None:
            v = [p["per_step"]["mfu_pct"] for p in perfs if p["per_step"].get("mfu_pct") is not None]
            return _r(float(np.median(v)), 2) if v else None

        return {"classes": rows, "mfu_pct": {"before": mfu(sides[0]), "after": mfu(sides[1])},
                "method": "achieved TFLOPS: executed FLOPs over the class's kernel time; ms per step over the profiled steps"}

    # -- output --------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        verdict, why = self.verdict
        k = self.kernels
        top = k.head(30)
        return {
            "schema": SCHEMA_ID,
            "before": _side_dict(self.before),
            "after": _side_dict(self.after),
            "verdict": verdict,
            "verdict_reason": why,
            "verdict_confidence": self.confidence,
            "verdict_from_parts": self.from_parts,
            "noise_floor_pct": self.noise_floor[0],
            "noise_floor_source": self.noise_floor[1],
            "confidence": CONFIDENCE,
            "per": self.per,
            "step_time_ms": self.step_time,
            "gpu_work_ms": self.gpu_work,
            "breakdown_delta_ms": {r["part"]: _r(r["delta_ms"]) for r in self.breakdown.iter_rows(named=True)},
            "breakdown_ms": [{k2: (_r(v) if isinstance(v, float) else v) for k2, v in r.items()} for r in self.breakdown.iter_rows(named=True)],
            "kernels": [
                {"name": r["name"], "before_ms": _r(r["before_ms"]), "after_ms": _r(r["after_ms"]), "delta_ms": _r(r["delta_ms"]),
                 "status": r["status"], "before_count": _r(r["before_count"], 2), "after_count": _r(r["after_count"], 2), "example": r["example"]}
                for r in top.iter_rows(named=True)
            ],
            "kernel_summary": {
                "matched": int((k["status"] == "matched").sum()) if k.height else 0,
                "new": k.filter(pl.col("status") == "new")["name"].to_list()[:20] if k.height else [],
                "vanished": k.filter(pl.col("status") == "vanished")["name"].to_list()[:20] if k.height else [],
            },
            "ops": _rows(self.ops.head(20)),
            "ranges": _rows(self.ranges.head(20)),
            "findings": {s: _rows(self.findings.filter(pl.col("status") == s).drop("status")) for s in ("resolved", "new", "persisting")},
            "unprofiled_step_ms": self.unprofiled_step_ms,
            "energy": self.energy,
            "perf": self.perf,
            "environment": _rows(self.environment.filter(pl.col("differs")).drop("differs")),
            "caveats": self.caveats,
        }

    def gate(self, fail_pct: float) -> int:
        """CI exit status: 1 when the verdict is a regression beyond ``fail_pct`` %, else 0."""
        return int(self.verdict[0] == "regressed" and self.step_time["delta_pct"] > fail_pct)

    def _repr_html_(self) -> str | None:
        return None if self.html_view is None else self.html_view(self)

    def __repr__(self) -> str:
        v, why = self.verdict
        return f"<Comparison {self.before.label} -> {self.after.label}: {v} ({why})>"


def compare(before: Side, after: Side, *, threshold_pct: float | None = None,
            unprofiled_steps_ms: tuple[list[float], list[float]] | None = None) -> Comparison:
    """Compare two sides; ``threshold_pct`` replaces the default noise floor (%);
    ``unprofiled_steps_ms`` (before, after): step times measured without the profiler."""
    if threshold_pct is not None and threshold_pct < 0:
        from proflab.errors import UsageError

        raise UsageError("--threshold must be >= 0")
    floor, src = (NOISE_FLOOR_PCT, "default") if threshold_pct is None else (float(threshold_pct), "--threshold")
    return Comparison(before, after, floor_pct=floor, floor_source=src, unprofiled_steps_ms=unprofiled_steps_ms)


# -- helpers ------------------------------------------------------------------------------------
def _rows(df: pl.DataFrame) -> list[dict[str, Any]]:
    return [{k: (_r(v) if isinstance(v, float) else v) for k, v in r.items()} for r in df.iter_rows(named=True)]


def _yn(v: bool | None) -> str:
    return "unknown" if v is None else ("yes" if v else "no")


def _settings(side: Side) -> dict[str, bool | None]:
    """What the profiler recorded, from the traces themselves where the metadata is silent:
    Python stacks (python_function events) and input shapes."""
    stack, shapes = set(), set()
    for part in side.parts:
        if part.with_stack is None:  # not a Kineto trace
            continue
        stack.add(part.with_stack)
        shapes.add(part.record_shapes)
    one = lambda s: next(iter(s)) if len(s) == 1 else None  # noqa: E731
    return {"with_stack": one(stack), "record_shapes": one(shapes)}


def _device_names(side: Side) -> list[str]:
    return sorted({r.device.get("name") for r in side.reports if r.device.get("name")})


def _environment(side: Side) -> dict[str, str | None]:
    env: dict[str, str | None] = {"gpu": ", ".join(_device_names(side)) or None}
    m = side.run
    if m:
        gpu = m.get("gpu") or {}
        env["gpu"] = ", ".join(g.get("name", "?") for g in gpu.get("gpus") or []) or env["gpu"]
        env["gpu_count"] = str(len(gpu.get("gpus") or [])) if gpu.get("gpus") else None
        env["driver"] = gpu.get("driver_version")
        env["cuda_driver"] = gpu.get("cuda_driver_version")
        v = m.get("versions") or {}
        for k in ("torch", "torch_cuda", "python", "proflab"):
            env[k] = v.get(k)
        git = m.get("git") or {}
        env["git_commit"] = None if not git.get("commit") else git["commit"][:12] + (" (dirty)" if git.get("dirty") else "")
        env["command"] = " ".join(m.get("command") or []) or None
        devs = (m.get("monitor") or {}).get("devices") or []
        clocks = [d.get("mean_sm_clock_mhz") for d in devs if d.get("mean_sm_clock_mhz") is not None]
        env["mean_sm_clock_mhz"] = None if not clocks else f"{sum(clocks) / len(clocks):.0f}"
        limits = [g.get("power_limit_w") for g in gpu.get("gpus") or [] if g.get("power_limit_w") is not None]
        env["power_limit_w"] = None if not limits else ", ".join(f"{x:g}" for x in limits)
    return env


def _energy(side: Side) -> dict[str, Any] | None:
    mon = side.monitor
    if mon is None or mon.height == 0 or not {"device", "time_ns", "energy_j"} <= set(mon.columns):
        return None
    from proflab.analysis.energy import energy_of, energy_per_step

    a = energy_of(mon, side.run, [p.trace for p in side.parts])
    e, why = energy_per_step(a)
    return {"energy_per_step_j": e, "refused": why or None, "run_energy_j": a.energy_j}


def _side_dict(side: Side) -> dict[str, Any]:
    return {
        "label": side.label,
        "inputs": [inp.get("path") for r in side.reports for inp in r.source.get("inputs", [])],
        "run_dir": bool(side.run),
        "device": ", ".join(_device_names(side)) or None,
        "median_step_ms": [r.summary.get("median_step_ms") for r in side.reports],
        "step_side": [r.summary.get("step_side") for r in side.reports],
    }


# -- two runs, read and analysed ---------------------------------------------------------------
def compare_runs(before: Any, after: Any, *, threshold_pct: float | None = None, top_kernels: int = 15,
                 unprofiled_steps_ms: tuple[list[float], list[float]] | None = None, load_trace: Any = None,
                 cache: bool | None = None, steps: str | None = None, window: str | None = None,
                 memory_budget: int | None = DEFAULT_BUDGET, all_parts: bool = False,
                 on_part: Callable[[int, str], None] | None = None) -> Comparison:
    """Two runs compared, each read and analysed as ``proflab.compare`` says (the public
    function in ``proflab.api`` documents the arguments): a :class:`Comparison`."""
    if all_parts and (steps or window):
        from proflab.errors import UsageError

        raise UsageError(f"all_parts compares every event of each trace; it takes no {'steps' if steps else 'window'}")
    reading = {"cache": cache, "steps": steps, "window": window, "memory_budget": memory_budget}
    read = load_trace or (lambda p: _load(p, **reading))
    opts = {**reading, "all_parts": all_parts, "on_part": on_part}
    sides = _side(before, "before", read, top_kernels, opts), _side(after, "after", read, top_kernels, opts)
    result = compare(*sides, threshold_pct=threshold_pct, unprofiled_steps_ms=unprofiled_steps_ms)
    if all_parts and any(s.run is not None for s in sides):
        # (a run directory's energy per step reads its traces' windows and steps again, past the budget)
        result.notes.append("energy per step: not compared with all parts (--all-parts); compare the run directories "
                            "without it, or see proflab energy RUN_DIR")
    return result


def _side(what: Any, tag: str, read: Any, top_kernels: int, opts: dict[str, Any] | None = None):
    """One side of a comparison from what ``compare_runs`` accepts."""
    import json

    from proflab.errors import SchemaError
    from proflab.model import Trace
    from proflab.readers import expand_paths

    items = list(what) if isinstance(what, (list, tuple)) else [what]
    run, monitor, sources = None, None, []
    for item in items:
        if isinstance(item, Trace):
            sources.append(item)
            continue
        p = Path(item)
        if p.is_dir() and (p / "meta.json").is_file():
            if len(items) > 1:
                from proflab.errors import UsageError

                raise UsageError(f"{p}: a run directory is one side of a comparison on its own")
            try:
                run = json.loads((p / "meta.json").read_text())
            except (OSError, ValueError) as e:
                raise SchemaError(p / "meta.json", f"not a readable run record ({e})") from e
            if not isinstance(run, dict):
                raise SchemaError(p / "meta.json", "expected a JSON object")
            if (p / "monitor.parquet").is_file():
                from proflab.readers.monitor import read_monitor

                monitor = read_monitor(p / "monitor.parquet")
        sources.extend(expand_paths([p]))
    if (opts or {}).get("all_parts"):
        monitor = None  # (its energy per step is not compared: see compare)
    # the energy of a run directory needs its traces: such a side is always read
    got = [_trace_part(s, read, top_kernels, opts or {}, keep_trace=monitor is not None) for s in sources]
    reports, parts = tuple(r for r, _ in got), tuple(p for _, p in got)
    label = str(items[0]) if len(items) == 1 and not isinstance(items[0], Trace) else f"{tag} ({len(parts)} traces)"
    return Side(label, reports, parts, run, monitor)


def _trace_part(source: Trace | Path, read: Any, top_kernels: int, opts: dict[str, Any], *, keep_trace: bool):
    """A trace's report and the tables a comparison takes from it: from the report cache when
    the file was compared before with the same options, else read, analysed and kept there."""
    from proflab.analysis.context import Context
    from proflab.model import Trace
    from proflab.report import cache as report_cache
    from proflab.report.analyze import placed
    from proflab.report.assemble import report_for

    key = None
    if isinstance(source, Path) and not keep_trace:
        options = {"compare": 1, "top": top_kernels, "steps": opts.get("steps"), "window": opts.get("window"),
                   "memory_budget": opts.get("memory_budget"), **({"all_parts": True} if opts.get("all_parts") else {})}
        key = report_cache.key(source, options, opts.get("cache"))
        got = report_cache.get_with_extra(key)
        if got is not None and got[1] is not None:
            try:
                return got[0], decode_part(got[1])
            except Exception:  # a damaged entry: analyse again (and replace it)
                pass
    if opts.get("all_parts") and isinstance(source, Path) and opts.get("memory_budget") is not None:
        from proflab.readers import load_parts
        from proflab.report.combine import report_in_parts

        got = []
        report = placed(lambda: report_in_parts(load_parts(source, budget=opts["memory_budget"], cache=opts.get("cache")),
                                                 top_kernels=top_kernels, each=lambda c: got.append(trace_part(c)),
                                                 on_part=opts.get("on_part")), str(source))
        part = combined_part(got)
    else:
        ctx = Context(source if isinstance(source, Trace) else read(source))
        report = report_for(ctx, top_kernels=top_kernels)
        part = trace_part(ctx, keep_trace=keep_trace)
    if key is not None:
        report_cache.put(key, report, extra=encode_part(part))
    return report, part
