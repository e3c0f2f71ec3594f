"""The energy of a run (``proflab.energy/1``) as terminal text or Markdown."""

from __future__ import annotations

from typing import Any

__all__ = ["render_energy"]


def _n(v, unit: str = "", nd: int = 1) -> str:
    if v is None:
        return "missing"
    return f"{v:,.{nd}f}{(' ' + unit) if unit else ''}"


def _device_lines(d: dict[str, Any]) -> list[str]:
    src = d["energy_source"]
    cross = ""
    if d.get("energy_integrated_j") is not None and src == "counter":
        cross = f" (integrated power {_n(d['energy_integrated_j'], 'J')}, {d['counter_vs_integrated_pct']:+.1f}%)"
    res = d.get("resolution_s")
    res_txt = "unknown" if res is None else (
        f"{res * 1e3:.0f} ms" + ("" if d.get("resolved") else " (changes at every sample: its own interval is at most this)"))
    if d.get("attribution_floor_s") is not None:
        res_txt += f"; no energy attributed below {d['attribution_floor_s'] * 1e3:.0f} ms ({d['attribution_floor_source']})"
    return [
        f"GPU {d['device']}: {_n(d['energy_j'], 'J')} over {_n(d['duration_s'], 's', 2)} from the {src}{cross}",
        f"  power: mean {_n(d['mean_power_w'], 'W')}, peak {_n(d['peak_power_w'], 'W')} (1-s average), "
        f"peak instant {_n(d.get('peak_power_instant_w'), 'W')}, limit {_n(d.get('power_limit_w'), 'W', 0)}"
        + ("" if d.get("power_limit_default_w") is None else f" (board default {_n(d['power_limit_default_w'], 'W', 0)})"),
        f"  idle (no kernel running): {_n(d['idle_s'], 's', 2)} at {_n(d['idle_power_w'], 'W')} = "
        f"{_n(d['energy_idle_j'], 'J')} ({_n(d['idle_energy_pct'], '%')} of the energy)",
        f"  counter resolution: {res_txt}",
        "  throttle reasons: " + ("not reported" if d.get("throttle_reasons_seen") is None
                                  else ", ".join(d["throttle_reasons_seen"]) or "none"),
    ]


def _window_lines(w: dict[str, Any]) -> list[str]:
    who = f"rank {w['rank']}" if w.get("rank") is not None else "trace"
    out = [f"{who} ({w['trace']}, GPU {w['device']}): window {_n(None if w['window_s'] is None else w['window_s'] * 1e3, 'ms')}, "
           f"{w['steps']} GPU-side steps, median {_n(w['median_step_ms'], 'ms', 2)}"]
    if w.get("window_energy_j") is not None:
        out.append(f"  window energy {_n(w['window_energy_j'], 'J')} (mean {_n(w['window_mean_power_w'], 'W')})")
    if w.get("energy_per_step_j") is not None:
        out.append(f"  energy per step {_n(w['energy_per_step_j'], 'J', 3)}")
    if w.get("steps_energy_j") is not None:
        cross = ("" if w.get("steps_energy_integrated_j") is None
                 else f"; integrated power {_n(w['steps_energy_integrated_j'], 'J')}")
        out.append(f"  steps: {_n(w['steps_energy_j'], 'J')} over {_n(w['steps_span_s'], 's', 3)} "
                   f"(mean {_n(w.get('steps_mean_power_w'), 'W')}{cross})")
    if w.get("refused"):
        out.append(f"  refused: {w['refused']}")
    if w.get("tflops_per_w") is not None:
        out.append(f"  TFLOPS/W: {w['tflops_per_w']:.3f} ({_n(w['tflops'], 'TFLOP/s')} over {w['flop'] / 1e12:,.1f} TFLOP "
                   f"in {_n(w['energy_to_solution_j'], 'J')}; integrated power gives {_n(w.get('tflops_per_w_integrated'), '', 3)})")
        out.append(f"  FLOPs from {w['flop_source']}")
    else:
        out.append(f"  TFLOPS/W: missing ({w.get('flop_missing') or 'no FLOP count'})")
    for r in (w.get("ranges") or [])[:8]:
        e = "missing" if r["energy_j"] is None else f"{r['energy_j']:,.1f} J ({r['energy_per_instance_j']:,.3f} J each)"
        out.append(f"  range {r['name']}: {e}; {r['with_energy']} of {r['instances']} long enough "
                   f"(median GPU span {_n(r['median_gpu_span_ms'], 'ms', 2)})")
    return out


def render_energy(d: dict[str, Any], fmt: str = "term", *, heading: bool = True, width: int = 80) -> str:
    """``d`` is ``EnergyAnalysis.to_dict()``. ``heading``: False inside another report;
    ``width``: terminal columns."""
    body: list[str] = [f"energy: {_n(d['energy_j'], 'J')} on {len(d['devices'])} GPU(s)"]
    for dev in d["devices"]:
        body += _device_lines(dev)
    for w in d["windows"]:
        body += _window_lines(w)
    findings = d.get("findings") or []
    for f in findings:
        body.append(f"[{f['severity']}] {f['title']} (est. {f['est_gain_ms']:.0f} ms, "
                    f"{_n(f['evidence'].get('est_energy_cost_j'), 'J')})")
        body.append(f"  fix: {f['fix']}")
    if not findings:
        body.append("no power cap or thermal throttling while the GPUs were busy" if not d.get("missing")
                    else "power cap / thermal throttling: not judged on every GPU (see missing)")
    for m in d.get("missing") or []:
        body.append(f"missing: {m['signal']}: {m['reason']}")
    for n in d["notes"]:
        body.append(f"note: {n}")
    if fmt == "md":
        lines = (["# proflab energy", ""] if heading else ["## Energy", ""]) + ["```text", *body, "```"]
        return "\n".join(lines) + "\n"
    body = [_wrap(line, width) for line in body]
    return ("\n".join(["ENERGY", *body]) if heading else "\n".join(["", "Energy", *body])) + "\n"


def _wrap(line: str, width: int) -> str:
    """One line wrapped to ``width``, continuation lines indented under its own indent + 2."""
    import textwrap

    indent = " " * (len(line) - len(line.lstrip()))
    return "\n".join(textwrap.wrap(line, width, subsequent_indent=indent + "  ", break_on_hyphens=False)) or line
