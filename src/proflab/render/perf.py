"""The "where the FLOPs go" section (``report["perf"]``): plain lines for the terminal, a
Markdown section, and the operator roofline as an SVG (drawn here, no plotting library: the
HTML page inlines it, ``proflab analyze --roofline FILE.svg`` writes it).

Names come from traces: the SVG's text goes through ``html.escape``, as in the page."""

from __future__ import annotations

import html
import math
from typing import Any

from proflab._controls import escape
from proflab.render._text import fmt_bytes, fmt_flops, flops_scale, fmt_num, kernel_label, shorten

__all__ = ["perf_headline", "perf_lines", "perf_markdown", "roofline_points", "roofline_svg"]

TOP = 8  # top operators shown in the terminal and Markdown tables


def _pct(v) -> str:
    return "n/a" if v is None else f"{v:.1f}%"


def _range(v, fmt=fmt_num) -> str:
    if isinstance(v, list):
        return f"{fmt(v[0])}-{fmt(v[1])}"
    return fmt(v)


def perf_headline(p: dict[str, Any]) -> list[str]:
    """MFU and HFU per step against the peak used, the FLOPs per step, what is modelled."""
    ps, cov = p["per_step"], p["coverage"]
    out = []
    peak = ps.get("mfu_peak") or {}
    if ps.get("model_flops") is not None:
        # scaled (TFLOP, GFLOP, MFLOP): a CPU run's 545 MFLOP a step once read "0 TFLOP"
        line = f"{fmt_flops(ps['model_flops'])} a step (model)"
        if ps.get("exec_flops") is not None and ps["exec_flops"] != ps["model_flops"]:
            line += f", {fmt_flops(ps['exec_flops'])} executed"
        if ps.get("mfu_pct") is not None:
            line += (f"; MFU {_pct(ps['mfu_pct'])}" + (f", HFU {_pct(ps['hfu_pct'])}" if ps.get("hfu_pct") is not None else "")
                     + f" of {(peak.get('dtype') or '').upper()} {fmt_num(peak.get('tflops'))} TFLOPS"
                     + f" over the {fmt_num(ps['step_ms'])} ms profiled step")
        out.append(line)
        if ps.get("mfu_unprofiled_pct") is not None:
            how = "measured" if ps.get("unprofiled_source") == "measured" else "estimated"
            out.append(f"unprofiled step {_range(ps['unprofiled_step_ms'])} ms ({how}): "
                       f"MFU {_range(ps['mfu_unprofiled_pct'], lambda v: fmt_num(v))}%")
    if cov.get("modelled_pct") is not None:
        out.append(f"modelled: {fmt_num(cov['modelled_pct'])}% of {fmt_num(cov['kernel_ms'])} ms of kernels"
                   + (f"; FLOPs from {p['flop_source']}" if p.get("flop_source") else ""))
    if p.get("peaks"):
        out.append(f"roofs: {p['peaks']['source']}; HBM {fmt_num(p['peaks']['hbm_gbps'])} GB/s")
    return out


def rate_scale(classes: list[dict[str, Any]]) -> tuple[float, str]:
    """The scale (from TFLOPS) and header of an achieved-FLOP/s column: TFLOPS unless every
    value is under 1, then GFLOPS or MFLOPS, so that a slow class does not print 0."""
    top = max((c["achieved_tflops"] or 0 for c in classes), default=0)
    if top >= 1 or top == 0:
        return 1.0, "TFLOPS"
    scale, prefix = flops_scale(top * 1e12)
    return 1e12 / scale, f"{prefix}FLOPS"


def _class_row(c: dict[str, Any], scale: float = 1.0) -> tuple:
    rate = None if c["achieved_tflops"] is None else round(c["achieved_tflops"] * scale, 3)
    return (c["class"], fmt_num(c["time_ms"]), fmt_num(c["share_pct"]), fmt_num(rate),
            fmt_num(None if c["achieved_gbps"] is None else round(c["achieved_gbps"])), c["bound"] or "-", fmt_num(c["lost_ms"]))


def perf_lines(p: dict[str, Any], width: int = 100) -> list[str]:
    """The section as plain lines: headline, classes, the top operators, the unmodelled."""
    out = perf_headline(p)
    if p["classes"] and not any(c.get("time_ms") for c in p["classes"]):
        # no GPU time (a CPU run): what each class computes and moves, not a table of zeros
        out.append(f"{'class':<12}{'calls':>8}{'FLOP (window)':>16}{'bytes':>12}{'FLOP/byte':>11}")
        for c in p["classes"]:
            out.append(f"{c['class']:<12}{fmt_num(c.get('count')):>8}{fmt_flops(c.get('flops')):>16}"
                       f"{fmt_bytes(c.get('bytes')):>12}{fmt_num(c.get('intensity_flop_per_byte')):>11}")
    elif p["classes"]:
        scale, head = rate_scale(p["classes"])
        out.append(f"{'class':<12}{'ms':>9}{'%':>6}{head:>9}{'GB/s':>8}  {'bound':<8}{'lost ms':>9}")
        for c in p["classes"]:
            r = _class_row(c, scale)
            out.append(f"{r[0]:<12}{r[1]:>9}{r[2]:>6}{r[3]:>9}{r[4]:>8}  {r[5]:<8}{r[6]:>9}")
        out.append(f"(ms: GPU time; %: of kernel time; {head}, GB/s: achieved; bound: the roof that limits it; "
                   "lost ms: time over its ideal at that roof)")
    tops = [o for o in p["top_ops"] if o.get("lost_ms")][:TOP]
    if tops:
        out.append("where a better kernel pays (time lost to the roof):")
        name_w = max(width - 34, 20)
        for o in tops:
            out.append(f"  {shorten(o['signature'], name_w):<{name_w}}{fmt_num(o['lost_ms']):>9} ms"
                       f"{fmt_num(o['pct_of_roof']):>7}% {(o['bound'] or '-'):<7}")
    for u in p["unmodelled"][:3]:
        out.append(shorten(f"unmodelled: {u['op']} {fmt_num(u['time_ms'])} ms ({fmt_num(u['share_pct'])}%): {u['reason']}", width))
    for m in p.get("missing") or []:
        out.append(shorten("missing: " + m, 2 * width))
    return out


def perf_markdown(p: dict[str, Any], esc) -> list[str]:
    lines = ["## Where the FLOPs go", ""]
    lines += [f"- {esc(x)}" for x in perf_headline(p)]
    lines.append("")
    if p["classes"]:
        lines += ["| class | ms | % of kernels | TFLOPS | GB/s | FLOP/byte | bound | roof | lost ms |",
                  "|---|---:|---:|---:|---:|---:|---|---|---:|"]
        for c in p["classes"]:
            lines.append(f"| {esc(c['class'])} | {fmt_num(c['time_ms'])} | {fmt_num(c['share_pct'])} | {fmt_num(c['achieved_tflops'])} | "
                         f"{fmt_num(c['achieved_gbps'])} | {fmt_num(c['intensity_flop_per_byte'])} | {esc(c['bound'] or '-')} | "
                         f"{esc(c['roof'] or '-')} | {fmt_num(c['lost_ms'])} |")
        lines.append("")
    tops = [o for o in p["top_ops"] if o.get("lost_ms")][:TOP]
    if tops:
        lines += ["Where a better kernel pays (time lost to the roof, ms):", "",
                  "| operator | calls | ms | TFLOPS | GB/s | bound | % of roof | lost ms |", "|---|---:|---:|---:|---:|---|---:|---:|"]
        for o in tops:
            lines.append(f"| {esc(shorten(o['signature'], 90))} | {fmt_num(o['count'])} | {fmt_num(o['time_ms'])} | "
                         f"{fmt_num(o['achieved_tflops'])} | {fmt_num(o['achieved_gbps'])} | {esc(o['bound'] or '-')} | "
                         f"{fmt_num(o['pct_of_roof'])} | {fmt_num(o['lost_ms'])} |")
        lines.append("")
    if p["unmodelled"]:
        lines.append("Unmodelled: " + "; ".join(f"{esc(u['op'])} {fmt_num(u['time_ms'])} ms ({fmt_num(u['share_pct'])} %, "
                                               f"{esc(u['reason'])})" for u in p["unmodelled"][:5]))
        lines.append("")
    for m in p.get("missing") or []:
        lines.append(f"> missing: {esc(m)}")
    return lines


# -- the roofline ------------------------------------------------------------------------------

def roofline_points(p: dict[str, Any], verdicts: list[dict[str, Any]] | tuple = ()) -> list[dict[str, Any]]:
    """The chart's points: each class and top operator at its arithmetic intensity (executed
    FLOPs per byte) and achieved TFLOPS; Nsight Compute's kernels (``verdicts``) at their
    DRAM intensity."""
    out = []
    for kind, rows in (("class", p.get("classes") or []), ("op", p.get("top_ops") or [])):
        for r in rows:
            ai, tf = r.get("intensity_flop_per_byte"), r.get("achieved_tflops")
            if ai and tf and ai > 0 and tf > 0:
                out.append({"kind": kind, "name": r.get("signature") or r["class"], "class": r["class"], "ai": float(ai),
                            "tflops": float(tf), "time_ms": r.get("time_ms") or 0.0})
    for v in verdicts or ():
        roof = v.get("roofline") or {}
        ai, g = (roof.get("intensity_flop_per_byte") or {}).get("dram"), roof.get("achieved_gflops")
        if ai and g and ai > 0 and g > 0:
            out.append({"kind": "kernel", "name": kernel_label(v["name"]), "class": "ncu", "ai": float(ai), "tflops": float(g) / 1e3,
                        "time_ms": 0.0})
    return out


def _tick(v: float) -> str:
    return f"{v:,.0f}" if v >= 1 else f"{v:g}"


_COLORS = {"gemm": "#4e79a7", "conv": "#f28e2b", "attention": "#e15759", "elementwise": "#76b7b2", "norm": "#59a14f",
           "softmax": "#edc948", "reduction": "#b07aa1", "embedding": "#ff9da7", "copy": "#9c755f", "optimizer": "#bab0ac",
           "ncu": "#333333"}


def roofline_svg(p: dict[str, Any], verdicts: list[dict[str, Any]] | tuple = (), *, width: int = 760, height: int = 440) -> str:
    """The operator roofline (log-log): HBM bandwidth's diagonal and the compute peaks of the
    dtypes used as horizontals, each class (a circle, its area its time) and the top
    operators (numbered, listed beneath) at their intensity and achieved TFLOPS, and Nsight
    Compute's kernels (triangles) where ``verdicts`` has them."""
    pts = roofline_points(p, verdicts)
    peaks = p.get("peaks") or {}
    bw = peaks.get("hbm_gbps")
    used = {c.get("dtype") for c in p.get("classes") or []}
    roofs = [(f"{d.upper()} {fmt_num(v)}", v) for d, v in (peaks.get("matrix_tflops") or {}).items() if d in used or d == "bf16"]
    if peaks.get("vector_fp32_tflops"):
        roofs.append((f"FP32 vector {fmt_num(peaks['vector_fp32_tflops'])}", peaks["vector_fp32_tflops"]))
    ys = [q["tflops"] for q in pts] + [v for _, v in roofs]
    xs = [q["ai"] for q in pts]
    x0 = 10 ** math.floor(math.log10(min(xs + [0.1]) / 2))
    x1 = 10 ** math.ceil(math.log10(max(xs + [1e3]) * 2))
    y0 = 10 ** math.floor(math.log10(min(ys + [1.0]) / 2))
    y1 = 10 ** math.ceil(math.log10(max(ys + [10.0]) * 1.5))
    L, R, T, B = 64, 150, 28, 48
    w, h = width - L - R, height - T - B

    def X(v: float) -> float:
        return L + w * (math.log10(v) - math.log10(x0)) / (math.log10(x1) - math.log10(x0))

    def Y(v: float) -> float:
        return T + h * (1 - (math.log10(v) - math.log10(y0)) / (math.log10(y1) - math.log10(y0)))

    e = lambda s: html.escape(escape(str(s)), quote=True)  # noqa: E731  (control characters shown as escapes: a name may hold any)
    tops = [q for q in pts if q["kind"] == "op"]
    listed = tops[:12]
    # (data-proflab marks it as proflab's own drawing: the page's checks tell it from markup a
    # name could only have brought in unescaped)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" data-proflab="roofline" width="{width}" height="{height + 16 * len(listed)}" '
           f'viewBox="0 0 {width} {height + 16 * len(listed)}" font-family="sans-serif" font-size="11" role="img" '
           f'aria-label="roofline of the operators">',
           '<title>Where the FLOPs go: operators against the roofline</title>',
           f'<rect x="{L}" y="{T}" width="{w}" height="{h}" fill="none" stroke="#999"/>']
    for k in range(int(math.log10(x0)), int(math.log10(x1)) + 1):
        x = X(10.0**k)
        out.append(f'<line x1="{x:.1f}" y1="{T}" x2="{x:.1f}" y2="{T + h}" stroke="#eee"/>'
                   f'<text x="{x:.1f}" y="{T + h + 14}" text-anchor="middle">{_tick(10.0**k)}</text>')
    for k in range(int(math.log10(y0)), int(math.log10(y1)) + 1):
        y = Y(10.0**k)
        out.append(f'<line x1="{L}" y1="{y:.1f}" x2="{L + w}" y2="{y:.1f}" stroke="#eee"/>'
                   f'<text x="{L - 4}" y="{y + 4:.1f}" text-anchor="end">{_tick(10.0**k)}</text>')
    out.append(f'<text x="{L + w / 2}" y="{height - 12}" text-anchor="middle">arithmetic intensity (executed FLOP per byte)</text>'
               f'<text x="14" y="{T + h / 2}" text-anchor="middle" transform="rotate(-90 14 {T + h / 2})">achieved TFLOPS</text>')
    top_roof = max((v for _, v in roofs), default=None)
    if bw:
        # the memory roof: TFLOPS = intensity x bandwidth, up to the highest compute roof
        xa, xb = x0, min(x1, (top_roof or y1) * 1e3 / bw)
        out.append(f'<line x1="{X(xa):.1f}" y1="{Y(max(xa * bw / 1e3, y0)):.1f}" x2="{X(xb):.1f}" y2="{Y(xb * bw / 1e3):.1f}" '
                   f'stroke="#555" stroke-dasharray="5 3"/>'
                   f'<text x="{X(xb) + 4:.1f}" y="{Y(xb * bw / 1e3) + 12:.1f}" fill="#555">HBM {e(fmt_num(bw))} GB/s</text>')
    for label, v in sorted(roofs, key=lambda r: -r[1]):
        xs0 = X(v * 1e3 / bw) if bw and x0 < v * 1e3 / bw < x1 else L
        out.append(f'<line x1="{xs0:.1f}" y1="{Y(v):.1f}" x2="{L + w}" y2="{Y(v):.1f}" stroke="#888"/>'
                   f'<text x="{L + w + 4}" y="{Y(v) + 4:.1f}" fill="#555">{e(label)} TFLOPS</text>')
    big = max((q["time_ms"] for q in pts if q["kind"] == "class"), default=1.0) or 1.0
    for q in pts:
        x, y, col = X(q["ai"]), Y(q["tflops"]), _COLORS.get(q["class"], "#666")
        tip = f"{q['name']}: {fmt_num(round(q['ai'], 2))} FLOP/byte, {fmt_num(round(q['tflops'], 3))} TFLOPS"
        if q["kind"] == "class":
            r = 4 + 12 * math.sqrt(q["time_ms"] / big)
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" fill="{col}" fill-opacity="0.55" stroke="{col}">'
                       f'<title>{e(tip)}, {e(fmt_num(q["time_ms"]))} ms</title></circle>'
                       f'<text x="{x + r + 2:.1f}" y="{y - 2:.1f}">{e(q["class"])}</text>')
        elif q["kind"] == "op":
            n = tops.index(q) + 1
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{col}"><title>{e(tip)}</title></circle>'
                       + (f'<text x="{x + 4:.1f}" y="{y + 11:.1f}" font-size="9">{n}</text>' if n <= len(listed) else ""))
        else:
            out.append(f'<path d="M{x:.1f},{y - 5:.1f} L{x + 5:.1f},{y + 4:.1f} L{x - 5:.1f},{y + 4:.1f} Z" fill="{col}">'
                       f'<title>{e(tip)} (Nsight Compute)</title></path>')
    for i, q in enumerate(listed, 1):
        out.append(f'<text x="{L}" y="{height + 16 * i - 4}">{i}. {e(shorten(q["name"], 110))}</text>')
    if not pts:
        out.append(f'<text x="{L + w / 2}" y="{T + h / 2}" text-anchor="middle" fill="#999">no operator with FLOPs, bytes '
                   f'and GPU time</text>')
    out.append("</svg>")
    return "".join(out)
