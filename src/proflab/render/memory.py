"""The memory section (``report["memory"]``): plain lines for the terminal, a Markdown section,
and the allocated/reserved plot (matplotlib, imported only when one is drawn)."""

from __future__ import annotations

from typing import Any

from proflab.analysis.labels import allocation_label
from proflab.render._text import esc, fmt_num, shorten

__all__ = ["memory_lines", "memory_markdown", "plot_memory", "render_memory"]


def _sources(m: dict[str, Any]) -> str:
    have = [k for k, v in (m.get("sources") or {}).items() if v.get("available")]
    lack = [k for k, v in (m.get("sources") or {}).items() if not v.get("available")]
    return "sources: " + (", ".join(have) or "none") + (f" (not available: {', '.join(lack)})" if lack else "")


def memory_lines(m: dict[str, Any], width: int = 100) -> list[str]:
    out = [_sources(m)]
    for d in m.get("devices") or []:
        total = d.get("device_memory_mib")
        out.append(
            f"GPU {d['device']}: peak {fmt_num(d['peak_allocated_mib'])} MiB allocated, {fmt_num(d['peak_reserved_mib'])} MiB reserved"
            + (f" of {fmt_num(total)} MiB ({fmt_num(d['peak_reserved_pct_of_device'])}%)" if total else "")
            + f"; at {fmt_num(d['peak_at_ms'])} ms, step {d['peak_step'] if d['peak_step'] is not None else '?'}, "
            f"in the {d['peak_phase']}"
        )
        cats = d.get("by_category_mib") or {}
        if cats:
            out.append("  at the peak (MiB): " + " · ".join(f"{k.replace('_', ' ')} {fmt_num(v)}" for k, v in cats.items() if v))
        for r in (d.get("top_allocations") or [])[:5]:
            out.append(shorten(f"  {fmt_num(r['mib']):>9} MiB  {r['category']:<15} {allocation_label(r)} [{r['phase']}]" + (f" x{r['count']}" if r["count"] > 1 else ""), width))
    steps = m.get("steps") or []
    if steps:
        out.append("per step (MiB): " + "  ".join(
            f"{s['step']}: peak {fmt_num(round(s['peak_allocated_mib']))}/{fmt_num(round(s['peak_reserved_mib']))} end {fmt_num(round(s['end_allocated_mib']))}"
            for s in steps[:8]
        ) + (" ..." if len(steps) > 8 else ""))
    for n in m.get("nvml") or []:
        out.append(f"NVML GPU {n['device']}: up to {fmt_num(n['max_used_mib'])} MiB used of {fmt_num(n['total_mib'])} MiB (all processes and the CUDA context)")
    snap = m.get("snapshot")
    if snap:
        for s in snap.get("devices") or []:
            out.append(
                f"snapshot GPU {s['device']}: {fmt_num(round(s['allocated_bytes'] / 2**20, 1))} MiB in {s['active_blocks']} blocks of "
                f"{fmt_num(round(s['reserved_bytes'] / 2**20, 1))} MiB reserved"
                + ("; most held at " + ", ".join(f"{t['site']} ({fmt_num(round(t['bytes'] / 2**20, 1))} MiB)" for t in s["top_sites"][:3]) if s.get("top_sites") else "")
            )
    for n in m.get("notes") or []:
        out.append("note: " + n)
    return out


def memory_markdown(m: dict[str, Any], esc) -> list[str]:
    lines = ["## GPU memory", "", esc(_sources(m)), ""]
    devs = m.get("devices") or []
    if devs:
        lines += ["| GPU | peak allocated MiB | peak reserved MiB | device MiB | step | phase | dominant |", "|---:|---:|---:|---:|---:|---|---|"]
        for d in devs:
            lines.append(
                f"| {d['device']} | {fmt_num(d['peak_allocated_mib'])} | {fmt_num(d['peak_reserved_mib'])} | {fmt_num(d.get('device_memory_mib'))} "
                f"| {d['peak_step'] if d['peak_step'] is not None else '-'} | {d['peak_phase']} | {esc(d.get('dominant_category') or '-')} |"
            )
        lines.append("")
        for d in devs:
            top = d.get("top_allocations") or []
            if top:
                lines += [f"Largest live allocations at GPU {d['device']}'s peak:", "", "| MiB | category | made by | phase | count |", "|---:|---|---|---|---:|"]
                for r in top:
                    lines.append(f"| {fmt_num(r['mib'])} | {r['category']} | {esc(allocation_label(r))} | {r['phase']} | {r['count']} |")
                lines.append("")
    for n in m.get("notes") or []:
        lines.append(f"- {esc(n)}")
    return lines


def render_memory(m: dict[str, Any], fmt: str, width: int = 100, findings: list[dict] | None = None) -> str:
    """The memory section on its own (``proflab memory``)."""
    if fmt == "json":
        import json

        return json.dumps({**m, "findings": findings or []}, indent=2)
    if fmt == "md":
        lines = memory_markdown(m, esc)
        for f in findings or []:
            lines += ["", f"### [{f['severity']}] {esc(f['title'])}", "", f"Fix: {esc(f['fix'])}"]
        return "\n".join(lines) + "\n"
    lines = memory_lines(m, width)
    for f in findings or []:
        lines += ["", f"{f['severity'].upper():<9}{f['title']}", f"   fix: {f['fix']}"]
    return "\n".join(lines) + "\n"


def plot_memory(analysis, out_path, fmt: str | None = None) -> None:
    """Allocated and reserved memory over the window per device, the peak and the steps marked;
    PNG or SVG by the file's suffix."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    devs = sorted(analysis.timelines)
    fig, axes = plt.subplots(len(devs), 1, figsize=(10, 3.2 * len(devs)), squeeze=False)
    for ax, dev in zip(axes[:, 0], devs):
        t = analysis.timelines[dev]
        x = (t["ts_ns"] - analysis.origin_ns) / 1e6
        ax.step(x, t["reserved"] / 2**20, where="post", label="reserved", color="#b0b0b0")
        ax.step(x, t["allocated"] / 2**20, where="post", label="allocated", color="#1f77b4")
        i = int(np.argmax(t["allocated"]))
        ax.plot([x[i]], [t["allocated"][i] / 2**20], "o", color="#d62728", label=f"peak {t['allocated'][i] / 2**20:.0f} MiB")
        for step, s0, _ in analysis.step_bounds:
            xs = (s0 - analysis.origin_ns) / 1e6
            if x[0] <= xs <= x[-1]:
                ax.axvline(xs, color="#999999", lw=0.6, ls=":")
                ax.text(xs, 0, f" {step}", fontsize=7, color="#666666", va="bottom")
        d = next((d for d in analysis.devices if d["device"] == dev), None)
        if d and d.get("device_memory_mib") and d["peak_reserved_mib"] > 0.5 * d["device_memory_mib"]:
            ax.axhline(d["device_memory_mib"], color="#d62728", lw=0.8, ls="--", label="device memory")
        ax.set_title(f"GPU {dev} memory (steps dotted)", fontsize=10)
        ax.set_xlabel("ms from the first allocation event")
        ax.set_ylabel("MiB")
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(out_path, format=fmt)
    plt.close(fig)
