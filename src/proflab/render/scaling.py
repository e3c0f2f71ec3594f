"""A scaling report as a table (terminal or Markdown) and as a plot (matplotlib, imported
only when a plot is asked for)."""

from __future__ import annotations

from pathlib import Path

from proflab.render._text import fmt_num

__all__ = ["render_scaling", "plot_scaling"]

_COLS = (
    ("label", "run"),
    ("gpus", "ranks"),
    ("step_ms", "step ms"),
    ("ideal_step_ms", "ideal"),
    ("efficiency_pct", "eff %"),
    ("loss_ms_per_step", "loss"),
    ("exposed_comm_ms_per_step", "exp.comm"),
    ("imbalance_wait_ms_per_step", "imbalance"),
    ("other_ms_per_step", "other"),
)
# shown where a point has its unprofiled step (proflab run measures it)
_BARE = (("bare_step_ms", "bare ms"), ("bare_efficiency_pct", "bare eff %"))


def render_scaling(rep, fmt: str) -> str:
    d = rep.to_dict()
    cols = _COLS + (_BARE if any(r.get("bare_step_ms") is not None for r in d["points"]) else ())
    names = _short_labels([r["label"] for r in d["points"]])
    cells = [[h for _, h in cols]] + [
        [names[i] if k == "label" else fmt_num(r.get(k)) for k, _ in cols] for i, r in enumerate(d["points"])
    ]
    head = (
        f"{d['mode']} scaling: efficiency against the run with the fewest GPUs; loss per step (ms) split into "
        "exposed communication, waiting for late ranks (imbalance) and the rest"
    )
    if fmt == "md":
        lines = ["# proflab scaling", "", head, "", "| " + " | ".join(cells[0]) + " |", "|" + "---:|" * len(cols)]
        lines += ["| " + " | ".join(c) + " |" for c in cells[1:]]
        lines += [f"- note: {n}" for n in d["notes"]]
        return "\n".join(lines) + "\n"
    widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    lines = [head, ""] + ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines += [f"note: {n}" for n in d["notes"]]
    return "\n".join(lines) + "\n"


def _short_labels(labels: list[str]) -> list[str]:
    """Each run's last path part where those tell the runs apart (the JSON keeps the paths)."""
    short = [Path(x).name or x for x in labels]
    return short if len(set(short)) == len(short) else labels


def plot_scaling(rep, path: str | Path, fmt: str | None = None) -> None:
    """Efficiency per GPU count (left) and the loss per step by cause (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rep.rows if r.get("efficiency_pct") is not None]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    g = [r["gpus"] for r in rows]
    a.plot(g, [r["efficiency_pct"] for r in rows], "o-", label="profiled steps")
    if all(r.get("bare_efficiency_pct") is not None for r in rows):
        a.plot(g, [r["bare_efficiency_pct"] for r in rows], "s-", label="unprofiled steps")
    a.axhline(100, color="grey", lw=0.8, ls="--", label="ideal")
    a.set_xlabel("GPUs (ranks)")
    a.set_ylabel(f"{rep.mode} scaling efficiency (%)")
    a.set_xticks(g)
    a.set_ylim(0, 110)
    a.legend()
    labels = [f"{r['gpus']}" for r in rows]
    bottom = [0.0] * len(rows)
    for key, name in (("exposed_comm_ms_per_step", "exposed communication"), ("imbalance_wait_ms_per_step", "imbalance (waiting)"), ("other_ms_per_step", "other")):
        vals = [max(r.get(key) or 0.0, 0.0) for r in rows]
        b.bar(labels, vals, bottom=bottom, label=name)
        bottom = [x + y for x, y in zip(bottom, vals)]
    b.set_xlabel("GPUs (ranks)")
    b.set_ylabel("loss per step (ms)")
    b.legend()
    fig.tight_layout()
    fig.savefig(str(path), format=fmt)
    plt.close(fig)
