"""Energy of a run directory: the NVML total-energy counter, aligned to the profiled window.

Sources, in order of trust:

- **The counter** (``energy_j``: ``nvmlDeviceGetTotalEnergyConsumption`` differenced from the
  monitor's start). Energy over a span is the counter's difference across it, linearly
  interpolated between samples. Integrated ``power_w`` (a trapezoid; on A100/H100 ``power_w``
  is itself a one-second average) is only the cross-check, or the source where the device has
  no counter (said in ``energy_source``).
- **The counter's resolution**: how often ``energy_j`` actually changes in the recorded
  samples (median time between changes). When it changes at every sample, the true update
  interval is hidden below the sampling period, and the sampling period is the resolution.
  No energy is attributed to a span shorter than that resolution: it is refused, with the
  numbers, rather than guessed from a power reading.

Alignment: the monitor stamps samples with the wall clock (``time_ns``, Unix epoch ns, taken
right after the reads of a device, so a sample's energy is up to one read's cost older than its
stamp). A Kineto trace's timestamps are relative to its ``baseTimeNanoseconds``; base + ts is
the same wall clock on the same host. The alignment is accepted only when the trace's window,
so placed, lies inside the monitor's span; otherwise window and per-step energy are refused.
A trace's CUDA device index is taken to be the NVML index (true unless CUDA_VISIBLE_DEVICES
reorders GPUs; said in the notes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from proflab.errors import EmptyTrace, InputError, InputNotFound, SchemaError

__all__ = ["EnergyAnalysis", "ENERGY_SCHEMA_ID", "analyze_energy", "counter_resolution", "device_energy",
           "energy_of", "energy_per_step", "load_monitor", "span_energy_j"]

ENERGY_SCHEMA_ID = "proflab.energy/1"
_NEEDED = ("device", "time_ns", "power_w", "energy_j")


def _r(v, nd=3):
    return None if v is None or (isinstance(v, float) and not np.isfinite(v)) else round(float(v), nd)


def load_monitor(run_dir: str | Path) -> pl.DataFrame:
    """``monitor.parquet`` of a run directory; one clear error when it is absent or unreadable."""
    p = Path(run_dir) / "monitor.parquet"
    if not p.is_file():
        raise InputNotFound(run_dir, "no monitor.parquet (run without the GPU monitor, or not a proflab run directory)")
    from proflab.readers.monitor import read_monitor

    df = read_monitor(p)
    lacking = [c for c in _NEEDED if c not in df.columns]
    if lacking:
        raise SchemaError(p, f"not GPU monitor samples (no column {', '.join(lacking)})")
    if df.height == 0:
        raise EmptyTrace(p, "holds no GPU monitor samples")
    return df.sort("device", "time_ns")


def counter_resolution(d: pl.DataFrame) -> dict[str, Any]:
    """How finely one device's energy counter resolves time, from its recorded samples.

    ``counter_update_s``: median time between samples at which ``energy_j`` changed;
    ``sample_period_s``: median time between samples; ``resolution_s``: the larger, the
    shortest span energy is attributed to. ``resolved``: False when the counter changed at
    (nearly) every sample, so its own interval is at most the sampling period."""
    t = d["time_ns"].to_numpy().astype(np.float64) / 1e9
    e = d["energy_j"].to_numpy()
    ok = ~np.isnan(e.astype(np.float64)) if e.dtype != object else np.array([v is not None for v in e])
    t, e = t[ok], e[ok].astype(np.float64)
    if len(t) < 3:
        return {"counter_update_s": None, "sample_period_s": None, "resolution_s": None, "resolved": False,
                "changes": 0, "samples": int(len(t))}
    period = float(np.median(np.diff(t)))
    changed = np.flatnonzero(np.diff(e) != 0) + 1
    upd = float(np.median(np.diff(t[changed]))) if len(changed) >= 2 else None
    every = len(changed) >= 0.9 * (len(t) - 1)
    res = max(period, upd or 0.0)
    return {"counter_update_s": _r(upd, 4), "sample_period_s": _r(period, 4), "resolution_s": _r(res, 4),
            "resolved": not every, "changes": int(len(changed)), "samples": int(len(t))}


def span_energy_j(d: pl.DataFrame, t0_ns: int, t1_ns: int) -> float | None:
    """Counter energy (J) of one device between two wall-clock instants, interpolated between
    samples; None when the span is outside the samples."""
    s = d.drop_nulls("energy_j")
    t = s["time_ns"].to_numpy()
    if not len(t) or t0_ns < t[0] or t1_ns > t[-1]:
        return None
    e = s["energy_j"].to_numpy().astype(np.float64)
    tf = (t - t[0]).astype(np.float64)
    a, b = np.interp([t0_ns - t[0], t1_ns - t[0]], tf, e)
    return float(b - a)


def span_integrated_j(d: pl.DataFrame, t0_ns: int, t1_ns: int) -> float | None:
    """Integrated ``power_w`` (J, trapezoid, the ends interpolated) of one device between two
    wall-clock instants: the cross-check of :func:`span_energy_j`; None outside the samples.
    On A100/H100 ``power_w`` is a one-second average, so it lags load changes by ~0.5 s."""
    s = d.select("time_ns", "power_w").drop_nulls()
    t = s["time_ns"].to_numpy()
    if len(t) < 2 or t0_ns < t[0] or t1_ns > t[-1]:
        return None
    p = s["power_w"].to_numpy().astype(np.float64)
    inner = (t > t0_ns) & (t < t1_ns)
    ts = np.concatenate([[t0_ns], t[inner], [t1_ns]]).astype(np.float64)
    ps = np.interp(ts, t.astype(np.float64), p)
    return _trapezoid(ps, (ts - ts[0]) / 1e9)


def _trapezoid(p: np.ndarray, t_s: np.ndarray) -> float:
    return float(np.sum((p[1:] + p[:-1]) / 2 * np.diff(t_s)))


def device_energy(d: pl.DataFrame, *, power_limit_w: float | None = None,
                  default_limit: tuple[float | None, str | None] = (None, None)) -> dict[str, Any]:
    """One device over the monitored run: energy (counter, integrated-power cross-check),
    mean/peak power, idle power and the energy spent idle; the power limit and the board's
    default limit (W, and where it comes from: NVML's default, or the datasheet's)."""
    dev = int(d["device"][0])
    t = d["time_ns"].to_numpy().astype(np.float64) / 1e9
    pw = d.select("time_ns", "power_w").drop_nulls()
    integrated = _trapezoid(pw["power_w"].to_numpy(), pw["time_ns"].to_numpy() / 1e9) if pw.height >= 2 else None
    ctr = d.drop_nulls("energy_j")
    counter = float(ctr["energy_j"][-1] - ctr["energy_j"][0]) if ctr.height >= 2 else None
    energy, source = (counter, "counter") if counter is not None else (integrated, "integrated power" if integrated is not None else "none")
    duration = float(t[-1] - t[0]) if len(t) > 1 else 0.0
    out: dict[str, Any] = {
        "device": dev,
        "samples": d.height,
        "duration_s": _r(duration),
        "energy_j": _r(energy),
        "energy_source": source,
        "energy_integrated_j": _r(integrated),
        "counter_vs_integrated_pct": _r((integrated / counter - 1) * 100, 2) if counter and integrated is not None else None,
        "mean_power_w": _r(energy / duration) if energy is not None and duration > 0 else None,
        "peak_power_w": _r(d["power_w"].max()),
        "peak_power_instant_w": _r(d["power_instant_w"].max()) if "power_instant_w" in d.columns else None,
        "power_limit_w": _r(power_limit_w),
        "power_limit_default_w": _r(default_limit[0]),
        "power_limit_default_source": default_limit[1],
        **counter_resolution(d),
    }
    # what the throttle signal said (null column: the GPU did not report it; missing, not none)
    if "throttle_mask" in d.columns and d["throttle_mask"].null_count() < d.height:
        from proflab.model.monitor import throttle_names

        seen = 0
        for m in d["throttle_mask"].drop_nulls().unique().to_list():
            seen |= int(m)
        out["throttle_reasons_seen"] = throttle_names(seen)
    else:
        out["throttle_reasons_seen"] = None
    # idle: intervals between two samples that both saw no kernel running (util_gpu_pct == 0)
    out.update(idle_power_w=None, idle_s=None, energy_idle_j=None, idle_energy_pct=None, idle_source=None)
    if "util_gpu_pct" in d.columns and d["util_gpu_pct"].null_count() < d.height and ctr.height >= 2:
        s = ctr.drop_nulls("util_gpu_pct")
        idle = (s["util_gpu_pct"] == 0).to_numpy()
        both = idle[1:] & idle[:-1]
        ts = s["time_ns"].to_numpy().astype(np.float64) / 1e9
        de = np.diff(s["energy_j"].to_numpy().astype(np.float64))
        dt = np.diff(ts)
        idle_s, idle_j = float(dt[both].sum()), float(de[both].sum())
        out.update(
            idle_s=_r(idle_s), energy_idle_j=_r(idle_j),
            idle_power_w=_r(idle_j / idle_s) if idle_s > 0 else None,
            idle_energy_pct=_r(100 * idle_j / energy, 1) if energy else None,
            idle_source="counter over intervals whose both samples had util_gpu_pct == 0",
        )
    return out


@dataclass
class EnergyAnalysis:
    """Energy of one run directory: per device, per profiled trace (rank), and notes on what
    was refused and why. ``to_dict()`` is the ``proflab.energy/1`` document."""

    run_dir: str
    devices: list[dict[str, Any]]
    windows: list[dict[str, Any]]
    alignment: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    findings: list = field(default_factory=list)  # rules.energy: Finding
    missing: list = field(default_factory=list)  # rules.energy: Missing
    monitor: pl.DataFrame | None = None
    meta: dict[str, Any] | None = None

    @property
    def energy_j(self) -> float | None:
        vals = [d["energy_j"] for d in self.devices]
        return None if not vals or any(v is None for v in vals) else _r(sum(vals))

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": ENERGY_SCHEMA_ID,
            "run_dir": self.run_dir,
            "energy_j": self.energy_j,
            "devices": self.devices,
            "windows": self.windows,
            "alignment": self.alignment,
            "findings": [f.to_dict() for f in self.findings],
            "missing": [m.to_dict() for m in self.missing],
            "notes": self.notes,
            "timeline": self.timeline(),
        }

    def timeline(self, max_points: int = 2000) -> dict[str, Any]:
        """Power over time with the GPU-side steps marked, as plain lists for a plot: seconds
        from the monitor's first sample (``t0_ns``, Unix epoch ns); each device's samples
        thinned to at most ``max_points`` (every ``stride``-th)."""
        mon = self.monitor
        out: dict[str, Any] = {"t0_ns": None, "max_points": max_points, "devices": [], "steps": []}
        if mon is None or mon.height == 0:
            return out
        t0 = int(mon["time_ns"].min())
        out["t0_ns"] = t0
        for (dev,), g in mon.group_by("device", maintain_order=True):
            stride = max(1, -(-g.height // max_points))
            g = g.gather_every(stride)
            out["devices"].append({
                "device": int(dev), "stride": stride,
                "t_s": [round((t - t0) / 1e9, 4) for t in g["time_ns"].to_list()],
                "power_w": [_r(v, 1) for v in g["power_w"].to_list()],
                "power_instant_w": [_r(v, 1) for v in g["power_instant_w"].to_list()] if "power_instant_w" in g.columns else None,
                "energy_j": [_r(v, 2) for v in g["energy_j"].to_list()],
            })
        # step_energy's start_s is from the device's first sample; re-base on the monitor's
        for w in self.windows:
            dev = w.get("device")
            if dev is None or not w.get("step_energy"):
                continue
            d0 = int(mon.filter(pl.col("device") == dev)["time_ns"].min())
            for r in w["step_energy"]:
                a = r["start_s"] + (d0 - t0) / 1e9
                out["steps"].append({"trace": w["trace"], "rank": w["rank"], "device": dev, "step": r["step"],
                                     "start_s": round(a, 4), "end_s": round(a + r["dur_ms"] / 1e3, 4)})
        return out

    @property
    def power_limits_w(self) -> dict[int, float]:
        return {d["device"]: d["power_limit_w"] for d in self.devices if d.get("power_limit_w") is not None}

    @property
    def default_power_limits_w(self) -> dict[int, tuple[float, str]]:
        """Per device, the board's default power limit (W) and where it comes from."""
        return {d["device"]: (d["power_limit_default_w"], d["power_limit_default_source"]) for d in self.devices
                if d.get("power_limit_default_w") is not None}

    @property
    def idle_power_w(self) -> dict[int, float | None]:
        return {d["device"]: d.get("idle_power_w") for d in self.devices}


def _meta(run_dir: Path) -> dict[str, Any]:
    p = run_dir / "meta.json"
    if not p.is_file():
        return {}
    try:
        m = json.loads(p.read_text())
    except (OSError, ValueError):
        return {}
    return m if isinstance(m, dict) else {}


def _limits(meta: dict[str, Any]) -> dict[int, float]:
    gpus = ((meta.get("gpu") or {}).get("gpus")) or []
    return {int(g["index"]): float(g["power_limit_w"]) for g in gpus
            if isinstance(g, dict) and g.get("index") is not None and g.get("power_limit_w") is not None}


def _default_limits(meta: dict[str, Any]) -> dict[int, tuple[float | None, str | None]]:
    """Per GPU, its board's default power limit (W) and its source: NVML's own, as the run
    recorded it, else the datasheet's for its name (``analysis.devices``), else unknown."""
    from proflab.analysis.devices import default_power_limit_w

    out = {}
    for g in ((meta.get("gpu") or {}).get("gpus")) or []:
        if not isinstance(g, dict) or g.get("index") is None:
            continue
        if g.get("power_limit_default_w") is not None:
            out[int(g["index"])] = (float(g["power_limit_default_w"]), "NVML's default limit for the board")
        elif (w := default_power_limit_w(g.get("name"))) is not None:
            out[int(g["index"])] = (w, f"the {g['name']} datasheet's maximum TDP")
    return out


def _names(meta: dict[str, Any]) -> dict[int, str]:
    gpus = ((meta.get("gpu") or {}).get("gpus")) or []
    return {int(g["index"]): str(g["name"]) for g in gpus
            if isinstance(g, dict) and g.get("index") is not None and g.get("name")}


def analyze_energy(run_dir: str | Path, *, traces: list | None = None, flops_per_step: float | None = None) -> EnergyAnalysis:
    """Energy of ``run_dir`` (a ``proflab run`` directory with ``monitor.parquet``): per GPU,
    and for each trace under ``traces/`` the energy of its profiled window, per GPU-side
    step and per user range, where the counter resolves them, and TFLOPS/W where the FLOPs
    are known. ``traces``: already loaded ``Trace`` objects; ``flops_per_step``: the FLOPs
    of one step of one rank, when the user knows them (else from the recorded shapes)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputNotFound(run_dir, "not a directory (proflab energy takes a run directory)")
    mon = load_monitor(run_dir)
    notes: list[str] = []
    if traces is None:
        traces = _load_traces(run_dir, notes)
    return energy_of(mon, _meta(run_dir), traces, label=str(run_dir), notes=notes, flops_per_step=flops_per_step,
                     ncu=_ncu(run_dir, notes))


def _ncu(run_dir: Path, notes: list[str]):
    """The run's Nsight Compute results (``proflab kernels`` writes ``ncu/raw.csv``), for
    FLOPs when no operator FLOPs were counted; None when absent or unreadable (said)."""
    raw = run_dir / "ncu" / "raw.csv"
    if not raw.is_file():
        return None
    from proflab.readers.ncu import load as load_ncu

    det = run_dir / "ncu" / "details.csv"
    try:
        return load_ncu([raw] + ([det] if det.is_file() else []))
    except InputError as e:
        notes.append(f"ncu/raw.csv: not read ({e}); no FLOPs from ncu")
        return None


def energy_of(mon: pl.DataFrame, meta: dict[str, Any] | None, traces: list, *, label: str = "",
              notes: list[str] | None = None, flops_per_step: float | None = None, ncu=None) -> EnergyAnalysis:
    """:func:`analyze_energy` on what is already read: monitor samples, ``meta.json`` (for
    the power limits; may be empty) and the run's traces."""
    meta = meta or {}
    notes = list(notes or [])
    mon = mon.sort("device", "time_ns")
    limits = _limits(meta)
    per_dev = {int(k[0]): g for k, g in mon.group_by("device", maintain_order=True)}
    defaults = _default_limits(meta)
    devices = [device_energy(g, power_limit_w=limits.get(dev), default_limit=defaults.get(dev, (None, None)))
               for dev, g in sorted(per_dev.items())]
    names = _names(meta)
    for d in devices:
        d["gpu_name"] = names.get(d["device"])
        d["attribution_floor_s"], d["attribution_floor_source"] = _floor(d, d["gpu_name"])
    windows = [_window(tr, per_dev, {d["device"]: d for d in devices}, notes, flops_per_step, ncu) for tr in traces]
    alignment = {
        "method": "trace wall clock = baseTimeNanoseconds + event timestamp; monitor time_ns is the wall clock "
                  "(Unix epoch ns) on the same host; accepted when the trace window lies inside the monitor's span",
        "aligned": [w["aligned"] for w in windows],
        "sample_stamp_lag_ms": _r((meta.get("monitor") or {}).get("mean_sample_cost_ms")),
    }
    if windows:
        notes.append("a trace's CUDA device index is taken as the NVML index (true unless CUDA_VISIBLE_DEVICES reorders GPUs)")
    return EnergyAnalysis(label, devices, windows, alignment, notes, monitor=mon, meta=meta)


def energy_per_step(a: EnergyAnalysis) -> tuple[float | None, str]:
    """Energy (J) per GPU-side step of the job: each profiled trace's (rank's) energy per
    step on its GPU, summed over ranks; None and why when any rank's is refused."""
    if not a.windows:
        return None, "no profiled trace to take steps from"
    for w in a.windows:
        if w["energy_per_step_j"] is None:
            return None, f"{w['trace']}: {w['refused'] or 'no GPU-side steps'}"
    return _r(sum(w["energy_per_step_j"] for w in a.windows), 4), ""


def _load_traces(run_dir: Path, notes: list[str]) -> list:
    from proflab.readers import load
    from proflab.readers.budget import DEFAULT_BUDGET

    tdir = run_dir / "traces"
    paths = sorted(p for p in tdir.glob("*.pt.trace.json*")) if tdir.is_dir() else []
    out = []
    for p in paths:
        try:
            out.append(load(p, budget=DEFAULT_BUDGET))  # as proflab.load reads it
        except InputError as e:
            notes.append(f"{p.name}: not read ({e}); its window has no energy")
    if not paths:
        notes.append("no torch.profiler trace in traces/: energy of the run only, no window or per-step energy")
    return out


# How often NVML's total-energy counter really updates, measured by tight-loop polling
# (benchmarks/probe_energy_counter.py; data in tests/data/energy/). Keyed by a substring of
# the GPU's name. A device not listed falls back on the interval seen in its own samples.
COUNTER_UPDATE_S: dict[str, tuple[float, str]] = {
    # 2026-11, driver 580.159.04: median 100.0 ms, longest 102.4 ms between changes, idle
    # (76 W) and under a bf16 GEMM load (698 W) alike
    "H100": (0.103, "measured by polling NVML: longest interval between changes, idle and under load "
                    "(tests/data/energy/nvml_counter_h100.json)"),
}


def _floor(d: dict[str, Any], name: str | None = None) -> tuple[float | None, str]:
    """The shortest span energy is attributed to on one device (s), and where it comes from:
    the larger of the counter resolution seen in the samples and the measured update interval
    of its GPU model."""
    seen = d.get("resolution_s")
    for key, (upd, src) in COUNTER_UPDATE_S.items():
        if name and key in name:
            if seen is None or upd >= seen:
                return upd, f"{key} energy counter update interval, {src}"
            return seen, "the counter resolution in this run's samples (coarser than the measured update interval)"
    if seen is None:
        return None, "unknown"
    return seen, "the counter resolution in this run's samples (this GPU's update interval was not measured)"


_MAX_STEP_ROWS = 2000


def _window(trace, per_dev: dict[int, pl.DataFrame], devs: dict[int, dict], notes: list[str],
            flops_per_step: float | None = None, ncu=None) -> dict[str, Any]:
    dist = trace.meta.distributed or {}
    rank = dist.get("rank") if isinstance(dist, dict) else None
    gdev = trace.gpu["device"].drop_nulls().unique().to_list()
    device = int(gdev[0]) if len(gdev) == 1 else None
    w: dict[str, Any] = {
        "trace": Path(trace.meta.source).name, "rank": rank, "device": device, "aligned": False,
        "window_s": None, "window_energy_j": None, "window_mean_power_w": None,
        "steps": 0, "median_step_ms": None, "steps_span_s": None, "energy_per_step_j": None,
        "energy_per_step_source": None, "steps_energy_j": None, "steps_energy_integrated_j": None, "steps_mean_power_w": None,
        "steps_with_energy": 0, "steps_refused": 0,
        "flop": None, "flop_per_step": None, "flop_source": None, "flop_missing": None,
        "tflops": None, "tflops_per_w": None, "tflops_per_w_integrated": None, "energy_to_solution_j": None,
        "step_energy": [], "ranges": [], "refused": None,
    }
    from proflab.analysis.context import Context

    ctx = Context(trace)
    flop_by_step = _flops(ctx, w, flops_per_step, ncu)
    base = trace.meta.base_time_ns
    if device is None or device not in per_dev:
        w["refused"] = f"the trace's GPU work is on devices {gdev}, not one monitored device"
        return w
    if base is None or not trace.has_gpu:
        w["refused"] = "the trace has no baseTimeNanoseconds (or no GPU work): its clock cannot be placed on the monitor's"
        return w
    d = per_dev[device]
    res = devs[device].get("attribution_floor_s", devs[device]["resolution_s"])
    t0, t1 = trace.window_ns
    a0, a1 = base + t0, base + t1
    m0, m1 = int(d["time_ns"].min()), int(d["time_ns"].max())
    w["window_s"] = _r((t1 - t0) / 1e9, 4)
    if not (m0 <= a0 and a1 <= m1):
        w["refused"] = (f"the trace window placed by its base time falls outside the monitor's span "
                        f"({(a0 - m0) / 1e9:+.3f} s from its start, {(a1 - m1) / 1e9:+.3f} s from its end): not aligned")
        return w
    w["aligned"] = True
    w["window_offset_s"] = _r((a0 - m0) / 1e9)
    gs = ctx.gpu_steps
    gs = gs.filter(pl.col("device") == device).sort("start_ns") if gs.height else gs
    w["steps"] = gs.height
    if gs.height:
        w["median_step_ms"] = _r(gs["dur_ns"].median() / 1e6)
        s0, s1 = int(gs["start_ns"].min()), int(gs["end_ns"].max())
        w["steps_span_s"] = _r((s1 - s0) / 1e9, 4)
    if res is None:
        w["refused"] = "the device's energy counter has too few samples to estimate its resolution"
        return w
    if (t1 - t0) / 1e9 < res:
        w["refused"] = (f"the profiled window ({(t1 - t0) / 1e6:.1f} ms) is shorter than the energy counter's "
                        f"resolution ({res * 1e3:.0f} ms): no energy attributed to it or to its steps")
    else:
        e = span_energy_j(d, a0, a1)
        w["window_energy_j"] = _r(e)
        w["window_mean_power_w"] = _r(e / ((t1 - t0) / 1e9)) if e is not None else None
    w["ranges"] = _range_energy(trace, ctx, d, base, device, res)
    if gs.height:
        durs = gs["dur_ns"].to_numpy() / 1e9
        ok = durs >= res
        w["steps_with_energy"] = int(ok.sum())
        w["steps_refused"] = int((~ok).sum())
        span = (s1 - s0) / 1e9
        if span >= res:
            e = span_energy_j(d, base + s0, base + s1)
            ei = span_integrated_j(d, base + s0, base + s1)
            w["steps_energy_j"] = _r(e)
            w["steps_energy_integrated_j"] = _r(ei)
            w["steps_mean_power_w"] = _r(e / span) if e is not None else None
            w["energy_per_step_j"] = _r(e / gs.height, 4) if e is not None else None
            w["energy_per_step_source"] = "steps' span energy / steps"
            if e and w["flop_per_step"] is not None:
                fl = w["flop_per_step"] * gs.height if w["flop_source"] == "user" else _step_flops(flop_by_step, gs)
                if not fl:
                    w["flop_missing"] = "FLOPs were not counted for every GPU-side step"
                else:
                    w["flop"] = int(fl)
                    w["tflops"] = _r(fl / span / 1e12, 2)
                    w["tflops_per_w"] = _r(fl / e / 1e12, 6)
                    w["tflops_per_w_integrated"] = _r(fl / ei / 1e12, 6) if ei else None
                    w["energy_to_solution_j"] = _r(e)
        elif w["refused"] is None:
            w["refused"] = (f"the {gs.height} GPU-side steps span {span * 1e3:.1f} ms, shorter than the counter's "
                            f"resolution ({res * 1e3:.0f} ms): no per-step energy")
        rows = []
        for st, a, dur, good in zip(gs["step"].to_list()[:_MAX_STEP_ROWS], gs["start_ns"].to_list(),
                                    gs["dur_ns"].to_list(), ok.tolist()):
            e = span_energy_j(d, base + a, base + a + dur) if good else None
            rows.append({"step": st, "start_s": _r((base + a - m0) / 1e9, 4), "dur_ms": _r(dur / 1e6),
                         "energy_j": _r(e, 4), "flop": flop_by_step.get(st)})
        w["step_energy"] = rows
        got = [r["energy_j"] for r in rows[:-1] if r["energy_j"] is not None]
        if len(rows) == gs.height >= 3 and rows[-1]["energy_j"] is None and len(got) == gs.height - 1:
            # only the last step is too short for the counter: its GPU window ends with its own
            # work (no next step bounds it), so it lacks the host time the others include. The
            # others, all of them, speak for a step (no selection of the long ones).
            w["energy_per_step_j"] = _r(sum(got) / len(got), 4)
            w["energy_per_step_source"] = (f"mean of the first {len(got)} steps (the last step's GPU window, "
                                           "only its own work, is below the attribution floor)")
    if w["tflops_per_w"] is None and w["flop_missing"] is None and w["flop_per_step"] is not None:
        w["flop_missing"] = "the steps got no energy (see refused), so no TFLOPS/W"
    return w


def _flops(ctx, w: dict[str, Any], user: float | None, ncu=None) -> dict[int, int]:
    """FLOPs of the window: given by the user (per step), else the model FLOPs of each step
    (``analysis.perf``: from the operators' recorded shapes, else from the step ``proflab
    run`` counted without the profiler), else from the run's Nsight Compute counts. Returns
    the FLOPs per host step (by step number) where counted."""
    if user is not None:
        w.update(flop_per_step=float(user), flop_source="user")
        return {}
    from proflab.analysis.deepdive.flops import ncu_flops
    from proflab.analysis.perf import counted_from, perf_for
    from proflab.readers.rundir import step_flops_of

    trace = ctx.trace
    missing = "the trace records no framework operators"
    if (trace.cpu.get_column("cat") == "cpu_op").any():
        p = perf_for(ctx, counted=counted_from(step_flops_of(trace.meta.source)) if trace.meta.source else None)
        per = p.steps.filter(pl.col("model_flops").is_not_null() & (pl.col("model_flops") > 0))
        if p.flop_source is not None and per.height:
            w["flop_source"] = f"model FLOPs per step, {p.flop_source}"
            w["flop_per_step"] = _r(float(per["model_flops"].median()), 0)
            return dict(zip(per["step"].to_list(), per["model_flops"].to_list()))
        missing = next((m for m in p.missing if m.startswith("FLOPs")), "no FLOPs counted in the steps")
    if ncu is not None:
        fc = ncu_flops(ncu, trace)
        if fc.flop is not None and fc.per_step.height:
            w["flop_source"] = fc.source
            w["flop_per_step"] = _r(float(fc.per_step["flop"].median()), 0)
            return dict(zip(fc.per_step["step"].to_list(), fc.per_step["flop"].to_list()))
        missing = f"{missing}; {fc.missing or 'no host steps to divide the counted FLOPs among'}"
    w["flop_missing"] = missing
    return {}


def _step_flops(per: dict[int, int], gs: pl.DataFrame) -> int | None:
    vals = [per.get(s) for s in gs["step"].to_list()]
    return None if any(v is None for v in vals) else int(sum(vals))


def _range_energy(trace, ctx, d: pl.DataFrame, base: int, device: int, res: float) -> list[dict[str, Any]]:
    """Per user range name (NVTX / record_function): the device's counter energy over each
    range instance's GPU-side span (first start to last end of the work it launched), where
    that span is at least the attribution floor. The energy is the whole GPU's over the span,
    not only this range's kernels."""
    ranges = trace.cpu.filter(
        (pl.col("cat") == "user_annotation") & ~pl.col("name").str.starts_with("ProfilerStep#") & pl.col("tid").is_not_null()
    ).select("name", "tid", "start_ns", "dur_ns")
    launches = ctx.launches
    if ranges.height == 0 or launches.height == 0:
        return []
    work = (
        trace.gpu.filter(pl.col("device") == device)
        .select("correlation", "start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))
        .join(launches.select("correlation", "tid", "launch_start_ns").drop_nulls("tid"), on="correlation", how="inner")
        .sort("tid", "launch_start_ns")
    )
    by_tid = {int(k[0]): g for k, g in work.group_by("tid")}
    acc: dict[str, dict[str, Any]] = {}
    for name, tid, a, dur in ranges.iter_rows():
        g = by_tid.get(int(tid))
        r = acc.setdefault(name, {"name": name, "instances": 0, "with_energy": 0, "refused": 0, "energy_j": 0.0,
                                  "gpu_span_ms": []})
        if g is None:
            continue
        t = g["launch_start_ns"].to_numpy()
        i, j = np.searchsorted(t, a), np.searchsorted(t, a + dur)
        if j <= i:
            continue
        r["instances"] += 1
        g0 = int(g["start_ns"][i:j].min())
        g1 = int(g["end_ns"][i:j].max())
        r["gpu_span_ms"].append((g1 - g0) / 1e6)
        e = span_energy_j(d, base + g0, base + g1) if (g1 - g0) / 1e9 >= res else None
        if e is None:
            r["refused"] += 1
        else:
            r["with_energy"] += 1
            r["energy_j"] += e
    out = []
    for r in acc.values():
        if not r["instances"]:
            continue
        spans = r.pop("gpu_span_ms")
        r["median_gpu_span_ms"] = _r(float(np.median(spans)))
        r["energy_j"] = _r(r["energy_j"]) if r["with_energy"] else None
        r["energy_per_instance_j"] = _r(r["energy_j"] / r["with_energy"], 4) if r["with_energy"] else None
        out.append(r)
    return sorted(out, key=lambda r: -(r["energy_j"] or 0))
