"""A job report (``JobReport``) as terminal text or Markdown: the job's findings, the
per-rank table and the collectives across ranks, then each rank's own report."""

from __future__ import annotations

from proflab.render._text import esc, evidence_lines, evidence_markdown, fmt_num

__all__ = ["render_job_terminal", "render_job_markdown"]

# (column key, header) of the per-rank table; ms over each rank's analysed window
_RANK_COLS = (
    ("rank", "rank"),
    ("step_ms", "step ms"),
    ("bare_step_ms", "bare"),
    ("compute_ms", "compute"),
    ("comm_ms", "comm"),
    ("exposed_wait_ms", "exp.wait"),
    ("exposed_transfer_ms", "exp.xfer"),
    ("starved_transfer_ms", "starved"),
    ("overlap_pct", "ovl %"),
    ("late_ms", "late"),
    ("host_only_ms", "host-only"),
)
_COLL_COLS = (
    ("group", "group"),
    ("collective", "collective"),
    ("bytes", "bytes"),
    ("count", "n"),
    ("skew_median_ms", "skew ms"),
    ("skew_max_ms", "max"),
    ("most_often_last_rank", "last"),
    ("transfer_median_ms", "xfer ms"),
    ("busbw_gbps", "busbw GB/s"),
    ("busbw_of_link_pct", "% link"),
)


# shown only when some rank has them (the unprofiled step: runs of `proflab run`)
_OPTIONAL = ("bare_step_ms",)


def _rank_cols(rows: list[dict]):
    return tuple((k, h) for k, h in _RANK_COLS if k not in _OPTIONAL or any(r.get(k) is not None for r in rows))


def _coll_cols(d: dict):
    """The collectives' columns; "% link" only when the link's peak is known."""
    return tuple((k, h) for k, h in _COLL_COLS if k != "busbw_of_link_pct" or d.get("link"))


def _step_legend(rows: list[dict]) -> str:
    sides = {r.get("step_side") for r in rows}
    side = "GPU-side (start of a step's first GPU work to the next's)" if sides == {"gpu"} else "host-side (ProfilerStep)" if sides == {"host"} else "per rank's side"
    out = f"step ms: median step, {side}"
    if any(r.get("bare_step_ms") is not None for r in rows):
        clocks = {r.get("bare_clock") for r in rows if r.get("bare_step_ms") is not None}
        how = " GPU-side (CUDA events)" if clocks == {"gpu"} else " host-side" if clocks == {"host"} else ""
        out += f"; bare: median step without the profiler,{how} measured in the rank's own process"
    return out


def _idle(row: dict) -> str:
    parts = [f"{k[5:-3]} {fmt_num(v)}" for k, v in row.items() if k.startswith("idle_") and k.endswith("_ms") and k != "idle_ms" and v]
    return ", ".join(parts)


def _table(rows: list[dict], cols, sep: str = "  ") -> list[str]:
    cells = [[h for _, h in cols]] + [[fmt_num(r.get(k)) if not isinstance(r.get(k), str) else r[k] for k, _ in cols] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    return [sep.join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]


def _header(d: dict) -> list[str]:
    s = d["summary"]
    out = [
        f"proflab job · {s['ranks']} ranks" + (f" of {s['world_size']}" if s.get("world_size") else "")
        + (f" · {s['backend']}" if s.get("backend") else "") + (f" · {s['device']}" if s.get("device") else ""),
        f"Window {fmt_num(s['wall_ms'])} ms (median rank) · median step {fmt_num(s['median_step_ms_fastest_rank'])}"
        f"–{fmt_num(s['median_step_ms_slowest_rank'])} ms across ranks",
        f"Collectives matched across ranks: {s['collectives_matched']} · arrival skew median {fmt_num(s['skew_median_ms'])} ms, "
        f"p90 {fmt_num(s['skew_p90_ms'])} ms · end spread {fmt_num(s['end_spread_median_us'])} us",
    ]
    if d.get("link"):
        out.append(f"Link reference: {d['link']['link']}, {fmt_num(d['link']['gbps_per_direction'])} GB/s per direction ({d['link']['source']})")
    return out


def render_job_terminal(job, *, width: int | None = None, color: bool = False) -> str:
    from proflab.render.terminal import render_terminal

    d = job.to_dict()
    lines = _header(d) + [""]
    import textwrap

    legend = (
        "Per rank (ms over the window; comm: in collectives; exp.wait: waiting in them for the last rank and "
        "exp.xfer: transferring after it, with no compute underneath; starved: of that, while the rank's GPU had no "
        "compute queued (its host behind); ovl %: collective time under compute; "
        f"late: how much later than all others it arrived; {_step_legend(d['ranks'])})"
    )
    lines += textwrap.wrap(legend, width=max(60, min(width or 80, 100)))
    lines += ["  " + x for x in _table(d["ranks"], _rank_cols(d["ranks"]))]
    for r in d["ranks"]:
        if _idle(r):
            lines.append(f"  rank {r['rank']} GPU idle by cause (ms): {_idle(r)}")
    if d["collectives"]:
        lines += ["", "Collectives across ranks"] + ["  " + x for x in _table(d["collectives"], _coll_cols(d))]
    lines += ["", "Job findings, largest estimated gain first"]
    if not d["findings"]:
        lines.append("  none: no straggler and no exposed communication worth a finding")
    for i, f in enumerate(d["findings"], 1):
        lines.append(f" {i} {f['severity'].upper()} {f['title']}")
        lines.append(f"   gain ≈ {fmt_num(f['est_gain_ms'])} ms ({fmt_num(f['est_gain_pct'])}%): {f['assumption']}")
        for e in evidence_lines(f["evidence"], (width or 80) - 5):  # in words, with units; a row under its label
            lines.append(f"       {e.strip()}" if e.startswith("  ") else f"   · {e}")
        lines.append(f"   fix: {f['fix']}")
    for m in d["missing"]:
        lines.append(f"missing: {m['signal']} ({m['reason']})")
    for n in d["notes"]:
        lines.append(f"note: {n}")
    text = "\n".join(lines) + "\n"
    for rank, rep in zip(d["source"]["ranks"], job.reports):
        text += f"\n── rank {rank} ──\n" + render_terminal(rep, width=width, color=color)
    return text


def render_job_markdown(job) -> str:
    from proflab.render.markdown import render_markdown

    d = job.to_dict()
    lines = ["# proflab job report", ""] + [f"- {esc(x)}" for x in _header(d)] + ["", "## Ranks", ""]
    cols = _rank_cols(d["ranks"])
    hdr = [h for _, h in cols]
    lines += [esc(_step_legend(d["ranks"])) + ".", "", "| " + " | ".join(hdr) + " |", "|" + "---:|" * len(hdr)]
    for r in d["ranks"]:
        lines.append("| " + " | ".join(fmt_num(r.get(k)) for k, _ in cols) + " |")
    idle = [f"- rank {r['rank']} GPU idle by cause (ms): {esc(_idle(r))}" for r in d["ranks"] if _idle(r)]
    lines += [""] + idle if idle else []
    if d["collectives"]:
        cols = _coll_cols(d)
        hdr = [h for _, h in cols]
        lines += ["", "## Collectives", "", "| " + " | ".join(hdr) + " |", "|" + "---:|" * len(hdr)]
        for r in d["collectives"]:
            lines.append("| " + " | ".join(esc(r[k]) if isinstance(r.get(k), str) else fmt_num(r.get(k)) for k, _ in cols) + " |")
    lines += ["", "## Job findings", ""]
    if not d["findings"]:
        lines.append("No job findings.")
    for i, f in enumerate(d["findings"], 1):
        lines += [f"### {i}. [{f['severity']}] {esc(f['title'])}", "",
                  f"*{f['category']}* — estimated gain {fmt_num(f['est_gain_ms'])} ms ({fmt_num(f['est_gain_pct'])} %): {esc(f['assumption'])}", ""]
        lines += evidence_markdown(f["evidence"])
        lines += [f"**Fix:** {esc(f['fix'])}", ""]
    for m in d["missing"]:
        lines.append(f"- missing: {esc(m['signal'])} ({esc(m['reason'])})")
    for n in d["notes"]:
        lines.append(f"- note: {esc(n)}")
    out = "\n".join(lines) + "\n"
    for rank, rep in zip(d["source"]["ranks"], job.reports):
        out += f"\n---\n\n## Rank {rank}\n\n" + render_markdown(rep)
    return out
