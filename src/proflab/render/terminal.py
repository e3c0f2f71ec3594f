"""Terminal: a rich summary that reads well in 80 columns.

User-controlled text (kernel, op and file names) goes in as ``rich.text.Text``, never as
markup, so a name like ``[bold]`` prints literally.
"""

from __future__ import annotations

import io
import re

from rich.console import Console, Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from proflab.render._text import (
    interval_says,
    UNIT_GLUE,
    combined_text,
    compiled_text,
    inference_lines,
    evidence_lines,
    fmt_bytes,
    fmt_num,
    glue_units,
    is_scope_note,
    gain_text,
    kernel_label,
    observer_line,
    printable,
    shorten,
    shorten_middle,
    unprofiled_steps,
)

__all__ = ["render_terminal"]

_SEV_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
_BAR = 30


def render_terminal(report, *, width: int | None = None, color: bool = False) -> str:
    width = width or 80
    buf = io.StringIO()
    console = Console(
        file=buf, width=width, force_terminal=color, color_system="standard" if color else None,
        no_color=not color, highlight=False, soft_wrap=False,
    )
    console.print(_body(printable(report.to_dict()), width))
    # Padding fills lines to the full width; trailing blanks only get in the way of pipes.
    # (the glue that kept each number on its unit's line is a plain space once wrapped)
    return "\n".join(line.rstrip() for line in buf.getvalue().replace(UNIT_GLUE, " ").splitlines()) + "\n"


def _line(text) -> Text:
    """One output line: user text never breaks the layout with its own newlines, and a
    number is never wrapped away from its unit."""
    return Text(glue_units(" ".join(str(text).split())))


def _duration_us(v) -> str:
    if v is None:
        return "n/a"
    return f"{fmt_num(round(v / 1000, 3))} ms" if abs(v) >= 1000 else f"{fmt_num(v)} us"


def _verdict(findings: list[dict], per: str | None = "step") -> Text | None:
    """One line up front: the run is healthy, or what costs it most."""
    if not findings:
        return None
    if findings[-1]["category"] == "healthy" and not any(f["severity"] in ("critical", "warning") for f in findings):
        line = Text("Verdict: ", style="bold")
        line.append("healthy", style="green")
        line.append(" — no cause of lost GPU time reaches 5% of the window")
        return line
    top = findings[0]
    line = Text("Verdict: ", style="bold")
    line.append(top["category"], style=_SEV_STYLE[top["severity"]])
    kind = str(top.get("id", "")).split(":", 1)[0]
    if kind != top["category"] and re.fullmatch(r"[a-z][a-z0-9_]*", kind):
        # a specific cause filed under a contract category (local_memory_spills is memory_bound)
        line.append(f" ({kind})")
    line.append(" — ")
    if (top.get("prediction") or {}).get("model") == "none":
        line.append(_line("no gain predicted: make the fix and measure it (proflab compare)"))
        return line
    line.append(_line(f"fixing it saves {fmt_num(top['est_gain_ms'])} ms {'a step' if per == 'step' else 'over the window'} "
                      f"({fmt_num(top['est_gain_pct'])}%, predicted)"))
    return line


def _kind(f: dict) -> str:
    """The finding's kind: its category, or the specific cause its id names
    (``host_bound_unconfirmed``, ``local_memory_spills``)."""
    kind = str(f.get("id", "")).split(":", 1)[0]
    return kind if re.fullmatch(r"[a-z][a-z0-9_]*", kind) else f["category"]


def _summary(d: dict, width: int) -> list:
    """The first screen: the verdict, GPU busy, and each finding on one line (what, its
    predicted saving, its fix, and its ``proflab try`` line where a knob makes the fix)."""
    s = d["summary"]
    out: list = []
    verdict = _verdict(d["findings"], s.get("gain_per"))
    if verdict:
        out.append(verdict)
    bits = []
    if s.get("gpu_busy_pct") is not None:
        bits.append(f"GPU busy {s['gpu_busy_pct']:.1f}%")
    if s.get("kind") != "ncu":
        steps = f"{s['step_count']} steps"
        if s.get("median_step_ms") is not None:
            steps += f", median {fmt_num(s['median_step_ms'])} ms" + (" GPU-side" if s.get("step_side") == "gpu" else "")
        bits += [steps, f"window {fmt_num(s['wall_ms'])} ms"]
    if bits:
        out.append(_line(" · ".join(bits)))
    compiled = compiled_text(s)
    if compiled:
        out.append(_line(compiled))
    together = combined_text(s)
    if together:
        out.append(_line(together))
    if not d["findings"]:
        return out
    per_step = s.get("gain_per") == "step"
    rows = []
    for i, f in enumerate(d["findings"], 1):
        gain = (f"{fmt_num(f['est_gain_ms'])} ms ({fmt_num(f['est_gain_pct'])}%)"
                if f["category"] != "healthy" and f.get("est_gain_ms") else "-")
        rows.append((f"{i:>2}", f["severity"], _kind(f), gain, f["fix"], (f.get("evidence") or {}).get("proflab_try")))
    kind_w = min(max(len("finding"), *(len(r[2]) for r in rows)), 26)
    gain_head = "saves a step" if per_step else "saves"
    gain_w = max(len(gain_head), *(len(r[3]) for r in rows))
    lead = 2 + 1 + 9 + kind_w + 1 + gain_w + 1
    fix_w = width - lead
    out.append(Text(""))
    head = f"{'#':>2} {'severity':<9}{'finding':<{kind_w}} {gain_head:<{gain_w}} " + ("fix" if fix_w >= 16 else "")
    out.append(Text(head, style="bold"))
    for n, sev, kind, gain, fix, knob in rows:
        t = Text(f"{n} ")
        t.append(f"{sev.upper():<9}", style=_SEV_STYLE[sev])
        t.append(f"{shorten(kind, kind_w):<{kind_w}} {gain:<{gain_w}} ")  # (padded: not through _line)
        if fix_w >= 16:
            t.append(_line(shorten(fix, fix_w)))
        out.append(t)
        if fix_w < 16:
            out.append(_indent(_line(shorten(fix, width - 6)), 6))
        if knob:
            tr = Text("try: ", style="bold")
            tr.append(_line(knob))
            out.append(_indent(tr, 12))
    legend = ("saves: the bare step time (without the profiler) its fix is predicted to save, a step, and its share of "
              "the step (of the window where no step could be replayed)" if per_step
              else "saves: the time its fix is predicted to save over the window, and its share of the window")
    out.append(Text(legend + "; each finding's evidence and full fix follow.", style="dim"))
    return out


def _name_table(name: tuple[str, int], numbers: tuple[tuple[str, int], ...], rows: list[tuple]) -> Table:
    """A table of a name column (cut with an ellipsis) and right-aligned number columns."""
    title, name_w = name[0], max(name[1], 20)
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    table.add_column(title, width=name_w, no_wrap=True, overflow="ellipsis")
    for header, w in numbers:
        table.add_column(header, justify="right", width=w)
    for row in rows:
        table.add_row(_line(shorten(row[0], name_w)), *(_line(c) for c in row[1:]))
    return table


def _indent(renderable, cols: int = 3) -> Padding:
    """Indented block whose wrapped lines keep the indent."""
    return Padding(renderable, (0, 0, 0, cols))


def _body(d: dict, width: int) -> Group:
    parts: list = []
    src = d["source"]["inputs"][0]
    s = d["summary"]
    dev = d["device"]
    head = Text("proflab ", style="bold")
    head.append(_line(shorten(src["path"].rsplit("/", 1)[-1], width - 30)))
    if dev.get("name"):
        head.append(" · ")
        units = "CUs" if dev["name"].startswith(("AMD", "Radeon")) else "SMs"  # AMD counts compute units
        head.append(_line(dev["name"] + (f" ({dev['sm_count']} {units})" if dev.get("sm_count") else "")))
    parts.append(head)
    scope = [n for n in d["notes"] if is_scope_note(n)]
    for n in scope:  # what the trace holds, when it is not a GPU trace proflab diagnoses: said first
        parts.append(Text(_line(n).plain, style="yellow"))
    parts.extend(_summary(d, width))
    parts.append(Text(""))
    parts.append(Text("Details", style="bold underline"))
    if s.get("kind") == "ncu":
        line = (f"Nsight Compute: {s['kernels_profiled']} kernels, {s['launches_profiled']} launches profiled, "
                f"{fmt_num(s['wall_ms'])} ms of kernel time")
    else:
        line = f"Window {fmt_num(s['wall_ms'])} ms · {s['step_count']} steps"
    if s.get("median_step_ms") is not None:
        line += f" · median step {fmt_num(s['median_step_ms'])} ms"
        sp = s.get("step_spread_ms")
        if sp:
            line += f" (p10 {fmt_num(sp.get('p10'))}, p90 {fmt_num(sp.get('p90'))})"
        if s.get("step_side") == "gpu":
            line += " GPU-side"
            cpu = s.get("median_cpu_step_ms")
            if cpu is not None and abs(cpu - s["median_step_ms"]) > 0.1 * s["median_step_ms"]:
                line += f"; host ranges {fmt_num(cpu)} ms"
    parts.append(Text(line))
    obs = observer_line(s)
    if obs:
        parts.append(Text(obs, style="cyan"))
    if s.get("gpu_busy_pct") is not None:
        busy = s["gpu_busy_pct"]
        filled = round(_BAR * busy / 100)
        t = Text(f"GPU busy {busy:5.1f}% ")
        t.append("█" * filled, style="green")
        t.append("░" * (_BAR - filled), style="dim")
        parts.append(t)
        b = s["breakdown_ms"]
        parts.append(_indent(Text(
            f"compute {fmt_num(b['compute'])} · comm {fmt_num(b['communication'])} · memcpy {fmt_num(b['memcpy'])}"
            f" · memset {fmt_num(b['memset'])} · idle {fmt_num(b['idle'])} ms"
        ), 2))
        idle = d.get("idle") or {}
        if idle.get("by_cause_ms"):
            causes = " · ".join(f"{k} {fmt_num(v)}" for k, v in idle["by_cause_ms"].items() if v)
            if causes:
                parts.append(_indent(Text(f"idle by cause (ms): {causes}"), 2))
    launch = d.get("launch") or {}
    if launch.get("kernels"):
        parts.append(_indent(_line(
            f"{fmt_num(launch['kernels'])} kernels, median {fmt_num(launch['median_kernel_us'])} us, "
            f"{fmt_num(launch['kernels_under_5us_pct'])}% under 5 us; launch->start median "
            f"{_duration_us(launch['median_launch_to_start_us'])}"
            + (f"; {fmt_num(launch['launches_per_step'])} launches/step" if launch.get("launches_per_step") is not None else "")
        ), 2))
    for m in d.get("memcpy") or []:
        parts.append(_indent(_line(
            f"memcpy {m['direction']} {m['memory']}: {fmt_num(m['count'])} copies, "
            + (f"{fmt_bytes(m['bytes'])}, " if m.get("bytes") is not None else "")
            + f"{fmt_num(m['time_ms'])} ms"
            # a rate is only meaningful for copies big enough to amortise their latency
            + (f", {fmt_num(m['achieved_gbps'])} GB/s" if m.get("achieved_gbps") is not None
               and (m.get("bytes") or 0) >= m["count"] * 65536 else "")
        ), 2))
    parts.extend(_inference_section(d["summary"]))
    parts.append(Text(""))
    parts.append(Text("Findings, largest predicted gain first", style="bold underline"))
    if not d["findings"]:
        parts.append(Text("  none"))
    for i, f in enumerate(d["findings"], 1):
        # the title wraps under itself, not back to column 0
        head = Table.grid(padding=(0, 1))
        head.add_column(width=2, justify="right", no_wrap=True)
        head.add_column(width=8, no_wrap=True)
        head.add_column(ratio=1)
        head.add_row(Text(str(i)), Text(f["severity"].upper(), style=_SEV_STYLE[f["severity"]]), _line(f["title"]))
        parts.append(head)
        if f["category"].startswith("memory_") and not f["est_gain_ms"]:
            note = _line(f"   memory: no time gain; {f['assumption']}" if f.get("assumption") else "   memory: no time gain")
            note.stylize("dim")
            parts.append(_indent(note))
        elif f["category"] != "healthy":
            gain = _line(
                "   " + gain_text(f, d["summary"].get("gain_per"))
                + (f" if {f['assumption']}" if f.get("assumption") else "")
            )
            gain.stylize("dim")
            parts.append(_indent(gain))
        ev = [e for e in evidence_lines(f["evidence"], width - 5) if not e.startswith("proflab try:")]
        shown = 0
        for e in ev:
            if not e.startswith("  "):
                shown += 1
                if shown > 10:
                    break
            # a row of a table of evidence goes under its label, wrapped under itself
            parts.append(_indent(_line(e), 7) if e.startswith("  ") else _indent(Text("· ").append(_line(e))))
        fix = _line("fix: " + f["fix"])
        fix.stylize("green")
        parts.append(_indent(fix))
        for k, v in f["where"].items():
            if v:
                names = [kernel_label(x) if k == "kernels" else str(x) for x in v[:5]]
                room = width - 4 - len(f"where {k}: ") - 2 * (len(names) - 1)
                if k == "kernels" and len(names) > 1 and sum(len(x) for x in names) > room:  # cut in the middle: distinct
                    names = [shorten_middle(x, max(room // len(names), 24)) for x in names]
                where = _line(shorten(f"where {k}: " + ", ".join(names), width - 4))
                where.stylize("dim")
                parts.append(_indent(where))
    if d["kernels"]:
        parts.append(Text(""))
        table = Table(title=None, box=None, pad_edge=False, show_edge=False, expand=False, header_style="bold")
        table.add_column("#", justify="right", width=2)
        name_w = max(width - 39, 20)
        table.add_column("hot kernel", width=name_w, no_wrap=True, overflow="ellipsis")
        table.add_column("ms", justify="right", width=9)
        table.add_column("count", justify="right", width=9)
        table.add_column("%", justify="right", width=5)
        table.add_column("TC", width=4)
        for i, k in enumerate(d["kernels"][:10], 1):
            tc = k["tensor_cores"] or "-"
            # cut in the middle: kernels of one family differ at the end of their names
            cells = (str(i), shorten_middle(kernel_label(k["name"]), name_w), fmt_num(k["total_ms"]), fmt_num(k["count"]),
                     f"{k['share_pct']:.1f}", tc)
            table.add_row(*(_line(c) for c in cells))
        parts.append(table)
        parts.append(Text("ms: total GPU time · count: launches · %: share of all kernel time · TC: runs on the "
                          "tensor cores", style="dim"))
    elif d.get("host_ops"):
        parts.append(Text(""))
        rows = [(o["name"], fmt_num(o["total_ms"]), fmt_num(o["count"])) for o in d["host_ops"][:10]]
        parts.append(_name_table(("top host ops", width - 24), (("ms", 9), ("count", 7)), rows))
    if d.get("kernel_verdicts"):
        parts.append(Text(""))
        parts.append(Text("Kernel deep dive (Nsight Compute)", style="bold underline"))
        for v in d["kernel_verdicts"]:
            parts.append(_line(shorten(kernel_label(v["name"]), width - 2)))
            parts.append(_indent(_line(v["headline"])))
            m = v["metrics"]
            mem = " · ".join(
                f"{lbl} {fmt_num(m[k])}%" for lbl, k in (("DRAM", "dram_pct"), ("L2", "l2_pct"), ("L1", "l1_pct"),
                                                         ("L2 hit", "l2_hit_pct"), ("tensor pipe", "tensor_pipe_pct"))
                if m.get(k) is not None
            )
            if mem:
                parts.append(_indent(_line(mem)))
            roof = v.get("roofline") or {}
            if roof.get("percent_of_roof") is not None:
                ai = (roof.get("intensity_flop_per_byte") or {}).get("dram")
                parts.append(_indent(_line(
                    f"roofline: {fmt_num(roof['achieved_gflops'])} GFLOP/s ({roof['main_precision']}), "
                    + (f"{fmt_num(ai)} FLOP/byte at DRAM, " if ai is not None else "")
                    + f"{fmt_num(roof['percent_of_roof'])}% of the roof ({roof['bound_by']}-bound)"
                )))
            lm = v.get("local_memory") or {}
            if lm:
                bits = [lm["kind"]]
                if lm.get("share_of_l1_sectors_pct") is not None:
                    bits.append(f"{fmt_num(lm['share_of_l1_sectors_pct'])}% of L1 sectors")
                bits += [f"{fmt_num(int(lm[k]))} {u}" for k, u in (("spill_requests", "spill requests"), ("registers_per_thread", "registers/thread"),
                                                               ("stack_bytes_per_thread", "B stack/thread")) if lm.get(k) is not None]
                parts.append(_indent(_line("local memory: " + ", ".join(bits))))
            if (v.get("metric_sources") or {}).get("tensor_pipe_pct"):
                parts.append(_indent(_line(f"tensor pipe from {v['metric_sources']['tensor_pipe_pct']}")))
            for st in v["stalls"][:2]:
                parts.append(_indent(_line(f"stall {st['reason']} {fmt_num(st['share_pct'])}%: {st['fix']}")))
    if d.get("ranges"):
        parts.append(Text(""))
        rows = [(r["name"], fmt_num(r["device"]), fmt_num(r["ranges"]), fmt_num(r["gpu_ms"])) for r in d["ranges"][:5]]
        parts.append(_name_table(("range (NVTX / record_function)", width - 36), (("dev", 3), ("n", 6), ("GPU ms", 10)), rows))
    if d.get("perf") and (d["perf"]["classes"] or d["perf"]["per_step"].get("model_flops")):
        from proflab.render.perf import perf_lines

        parts.append(Text(""))
        parts.append(Text("Where the FLOPs go", style="bold underline"))
        # (the report went through printable(): a name's control characters are escapes, so
        # the table's lines keep their spacing)
        parts.extend(Text(x) for x in perf_lines(d["perf"], width))
    if d.get("memory"):
        from proflab.render.memory import memory_lines

        parts.append(Text(""))
        parts.append(Text("GPU memory", style="bold underline"))
        parts.extend(_line(x) for x in memory_lines(d["memory"], width))
    if d["missing"]:
        parts.append(Text(""))
        for m in d["missing"]:
            t = Text("missing: ", style="yellow")
            t.append(_line(f"{m['signal']} — {m['reason']}"))
            if m["skipped"]:
                skipped = _line(f"; skipped: {', '.join(m['skipped'])}")
                skipped.stylize("dim")
                t.append(skipped)
            parts.append(t)
    for n in d["notes"]:
        if n not in scope:
            parts.append(_line("note: " + n))
    return Group(*parts)


# -- comparisons ------------------------------------------------------------------------------
_VERDICT_STYLE = {"improved": "bold green", "regressed": "bold red", "no_change": "bold", "unknown": "yellow"}


def render_compare_terminal(comparison, *, width: int | None = None, color: bool = False) -> str:
    """A comparison in 80 columns: verdict, step time, where time moved, findings, kernels."""
    width = width or 80
    d = comparison.to_dict()
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=color, color_system="standard" if color else None,
                      no_color=not color, highlight=False, soft_wrap=False)
    s = d["step_time_ms"]
    out = [Text.assemble(("proflab compare: ", "bold"), (d["verdict"].replace("_", " ").upper(), _VERDICT_STYLE[d["verdict"]]))]
    out.append(_line(f"before: {d['before']['label']}"))
    out.append(_line(f"after:  {d['after']['label']}"))
    ci = s["ci_pct"]
    pct = lambda v: "n/a" if v is None else f"{v:+.1f} %"  # noqa: E731
    side = {"gpu": "GPU-side", "unprofiled": "unprofiled, measured"}.get(s.get("side"), s.get("side") or "n/a")
    out.append(_line(f"median step ({side}): {fmt_num(s['before'])} -> {fmt_num(s['after'])} ms, {pct(s['delta_pct'])}"
                     + ("" if ci is None else f", 95% interval [{ci[0]:+.1f}, {ci[1]:+.1f}] %" if interval_says(d)
                        else f", {d['verdict_confidence']['why']}")
                     + f" ({s['steps_before']} vs {s['steps_after']} steps)"))
    w = d.get("gpu_work_ms")
    if w:
        out.append(_line(f"GPU work per step: {fmt_num(w['before'])} -> {fmt_num(w['after'])} ms, {pct(w['delta_pct'])}"))
    if (u := unprofiled_steps(d)) is not None:
        out.append(_line(f"unprofiled step ({u[0]}): {u[1]} -> {u[2]} ms"))
    e = d.get("energy")
    if e:
        out.append(_line(f"energy per step (NVML counter): {fmt_num(e['before']['energy_per_step_j'])} -> {fmt_num(e['after']['energy_per_step_j'])} J, {pct(e['delta_pct'])}"))
        for side in ("before", "after"):
            if e[side].get("refused"):
                out.append(_line(f"  {side}: no energy per step: {e[side]['refused']}"))
    # the floor said once: in the reason where it decided, else here
    floor = "" if "noise floor" in d["verdict_reason"] else f"; noise floor {fmt_num(d['noise_floor_pct'])} % ({d['noise_floor_source']})"
    out.append(_line(f"{d['verdict_reason']}{floor}"))
    unit = "ms/step" if d["per"] == "step" else "ms"
    rows = [r for r in d["breakdown_ms"] if r["before_ms"] or r["after_ms"]]
    if rows:
        t = Table(title=f"Where the time moved ({unit})", title_justify="left", box=None, pad_edge=False)
        for c, j in (("part", "left"), ("before", "right"), ("after", "right"), ("change", "right"), ("clear", "left")):
            t.add_column(c, justify=j)
        for r in rows:
            t.add_row(Text(r["part"]), fmt_num(r["before_ms"]), fmt_num(r["after_ms"]), f"{r['delta_ms']:+,.3f}", "yes" if r["clear"] else "no")
        out += [Text(""), t]
    pf = d.get("perf")
    if pf and pf["classes"]:
        t = Table(title="Achieved TFLOPS by operator class", title_justify="left", box=None, pad_edge=False)
        for c, j in (("class", "left"), ("before", "right"), ("after", "right"), ("change", "right"), ("ms/step", "right")):
            t.add_column(c, justify=j)
        for r in pf["classes"]:
            t.add_row(Text(r["class"]), fmt_num(r["before_tflops"]), fmt_num(r["after_tflops"]), pct(r["tflops_change_pct"]),
                      f"{fmt_num(r['before_ms_per_step'])} -> {fmt_num(r['after_ms_per_step'])}")
        m = pf["mfu_pct"]
        mfu = lambda v: "n/a" if v is None else f"{fmt_num(v)}%"  # noqa: E731
        out += [Text(""), t, _line(f"MFU {mfu(m['before'])} -> {mfu(m['after'])}")]
    f = d["findings"]
    if any(f.values()):
        out += [Text(""), Text("Findings", style="bold")]
        for status in ("resolved", "new", "persisting"):
            for x in f[status]:
                out.append(Text.assemble((f"  {status:<10} ", "bold"), (shorten(f"{x['id']}: {x['title']}", width - 14), "")))
    if d["kernels"]:
        t = Table(title=f"Kernels ({unit}, largest change first)", title_justify="left", box=None, pad_edge=False)
        t.add_column("kernel", overflow="ellipsis", no_wrap=True, max_width=max(width - 40, 20))
        for c in ("before", "after", "change"):
            t.add_column(c, justify="right")
        t.add_column("")
        for k in d["kernels"][:10]:
            t.add_row(Text(shorten(k["name"], max(width - 40, 20))), fmt_num(k["before_ms"]), fmt_num(k["after_ms"]), f"{k['delta_ms']:+,.3f}", k["status"])
        ks = d["kernel_summary"]
        out += [Text(""), t, _line(f"{ks['matched']} matched, {len(ks['new'])} new, {len(ks['vanished'])} vanished")]
    if d["environment"]:
        out += [Text(""), Text("Environment differences", style="bold")]
        out += [_line(f"  {r['key']}: {r['before'] or 'n/a'} -> {r['after'] or 'n/a'}") for r in d["environment"]]
    if d["caveats"]:
        out.append(Text(""))
        out += [_line(f"note: {c}") for c in d["caveats"]]
    console.print(Group(*out))
    return "\n".join(line.rstrip() for line in buf.getvalue().replace(UNIT_GLUE, " ").splitlines()) + "\n"


def _inference_section(summary: dict) -> list:
    """A generation loop's figures (``render._text.inference_lines``): its own section, so that it
    moves as one piece."""
    return [_line(x) for x in inference_lines(summary)]
