"""The hierarchical roofline chart (SVG or PNG, from the file suffix) of a deep-dive report.

One point per kernel and memory level (DRAM, L2, L1) at its arithmetic intensity and achieved
FLOP/s; the memory roofs are diagonals, the compute roofs (per precision) horizontals. Kernel
names go through matplotlib's text layer, which escapes them in SVG; they are also shortened.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proflab.render._text import kernel_label, shorten

__all__ = ["write_roofline"]

_LEVEL_MARKERS = {"dram": "o", "l2": "s", "l1": "^"}
_LEVEL_NAMES = {"dram": "DRAM", "l2": "L2", "l1": "L1"}


def write_roofline(verdicts: list[dict[str, Any]], path: str | Path) -> int:
    """Draw the chart for ``verdicts`` (``Report.verdicts``) into ``path``; returns the number
    of kernels plotted (those with FLOPs, bytes and a duration)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = []
    roofs_bw: dict[str, float] = {}
    roofs_flops: dict[str, float] = {}
    for v in verdicts:
        r = v.get("roofline") or {}
        for lvl, bw in (r.get("peak_bandwidth_gbps") or {}).items():
            roofs_bw[lvl] = max(roofs_bw.get(lvl, 0.0), bw * 1e9)
        for prec, pk in (r.get("peak_gflops") or {}).items():
            roofs_flops[prec] = max(roofs_flops.get(prec, 0.0), pk * 1e9)
        ach = r.get("achieved_gflops")
        if not ach:
            continue
        for lvl, ai in (r.get("intensity_flop_per_byte") or {}).items():
            if ai:
                points.append((v["name"], lvl, ai, ach * 1e9))
    fig, ax = plt.subplots(figsize=(9, 6), dpi=110)
    xs = [p[2] for p in points] or [1.0]
    lo, hi = min(min(xs) / 10, 0.01), max(max(xs) * 10, 1e4)
    import numpy as np

    grid = np.logspace(np.log10(lo), np.log10(hi), 200)
    top = max(roofs_flops.values()) if roofs_flops else None
    for lvl, bw in sorted(roofs_bw.items()):
        y = grid * bw
        if top:
            y = np.minimum(y, top)
        ax.plot(grid, y, "--", lw=1, label=f"{_LEVEL_NAMES.get(lvl, lvl)} {bw / 1e12:.1f} TB/s")
    for prec, pk in sorted(roofs_flops.items(), key=lambda kv: kv[1]):
        ax.axhline(pk, lw=0.8, color="grey", alpha=0.6)
        ax.text(hi, pk, f" {prec} {pk / 1e12:.0f} TFLOP/s", va="center", ha="left", fontsize=7)
    names = sorted({p[0] for p in points})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, name in enumerate(names):
        c = colors[i % len(colors)]
        for _, lvl, ai, fl in (p for p in points if p[0] == name):
            ax.scatter([ai], [fl], marker=_LEVEL_MARKERS.get(lvl, "x"), color=c, s=36, zorder=3)
        dram = [p for p in points if p[0] == name and p[1] == "dram"] or [p for p in points if p[0] == name]
        ax.annotate(shorten(kernel_label(name), 40), (dram[0][2], dram[0][3]), fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title("Hierarchical roofline (o DRAM, s L2, ^ L1)")
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    if roofs_bw:
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    from proflab._io import atomic_path

    p = Path(path)
    with atomic_path(p) as tmp:
        fig.savefig(tmp, format=p.suffix.lstrip(".").lower() or "svg")
    plt.close(fig)
    return len(names)
