"""Markdown: for pull requests, issues and notebooks. Names are escaped, never trusted."""

from __future__ import annotations

from proflab.render._text import (
    interval_says,
    combined_text,
    esc,
    evidence_markdown,
    fmt_num,
    gain_text,
    inference_lines,
    is_scope_note,
    kernel_label,
    observer_line,
    printable,
    shorten,
    unprofiled_steps,
)

__all__ = ["render_markdown"]


def render_markdown(report) -> str:
    d = printable(report.to_dict())
    src = d["source"]["inputs"][0]
    s = d["summary"]
    dev = d["device"]
    lines = [f"# proflab report: {esc(src['path'])}", ""]
    scope = [n for n in d["notes"] if is_scope_note(n)]
    lines += [f"> {esc(n)}" for n in scope] + ([""] if scope else [])
    lines.append(f"- Device: {esc(dev.get('name') or 'unknown')}")
    lines.append(f"- Window: {fmt_num(s['wall_ms'])} ms, {s['step_count']} steps"
                 + (f", median step {fmt_num(s['median_step_ms'])} ms" if s.get("median_step_ms") is not None else "")
                 + (" (GPU-side)" if s.get("step_side") == "gpu" else ""))
    if observer_line(s):
        lines.append(f"- {observer_line(s)}")
    if s.get("gpu_busy_pct") is not None:
        b = s["breakdown_ms"]
        lines.append(f"- GPU busy: {fmt_num(s['gpu_busy_pct'])} %")
        lines += ["", "| compute ms | communication ms | memcpy ms | memset ms | idle ms |", "|---:|---:|---:|---:|---:|"]
        lines.append("| " + " | ".join(fmt_num(b[k]) for k in ("compute", "communication", "memcpy", "memset", "idle")) + " |")
    steps = [r for r in d.get("steps", []) if r.get("gpu_busy_pct") is not None]
    if steps:
        lines += ["", "## Steps", "", "| step | device | ms | GPU busy % | compute ms | comm ms | memcpy ms | memset ms | idle ms |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in steps[:50]:
            lines.append("| " + " | ".join(fmt_num(r[k]) for k in (
                "step", "device", "dur_ms", "gpu_busy_pct", "compute_ms", "communication_ms", "memcpy_ms", "memset_ms", "idle_ms")) + " |")
        if len(steps) > 50:
            lines.append(f"\n({len(steps) - 50} more steps in the JSON report)")
    launch = d.get("launch") or {}
    if launch.get("kernels"):
        lines += ["", f"- Launches: {fmt_num(launch['kernels'])} kernels, median {fmt_num(launch['median_kernel_us'])} µs, "
                  f"{fmt_num(launch['kernels_under_5us_pct'])} % under 5 µs, launch-to-start median "
                  f"{fmt_num(launch['median_launch_to_start_us'])} µs, {fmt_num(launch['launches_per_step'])} launches per step"]
    for m in d.get("memcpy") or []:
        lines.append(f"- Copies {esc(m['direction'])} ({esc(m['memory'])}): {fmt_num(m['count'])}, {fmt_num(m['bytes'])} bytes, "
                     f"{fmt_num(m['time_ms'])} ms, {fmt_num(m['achieved_gbps'])} GB/s")
    inference = inference_lines(d["summary"])
    if inference:  # a generation loop's figures, as the terminal says them
        lines += ["", "## Inference", "", *(f"- {esc(x.strip())}" for x in inference)]
    lines += ["", "## Findings", ""]
    if (together := combined_text(d["summary"])):
        lines += [esc(together), ""]
    if not d["findings"]:
        lines.append("No findings.")
    for i, f in enumerate(d["findings"], 1):
        lines.append(f"### {i}. [{f['severity']}] {esc(f['title'])}")
        lines.append("")
        lines.append(f"*{f['category']}* — {esc(gain_text(f, d['summary'].get('gain_per')))}"
                     + (f", assuming {esc(f['assumption'])}" if f.get("assumption") else ""))
        lines.append("")
        lines += evidence_markdown(f["evidence"])
        lines.append(f"**Fix:** {esc(f['fix'])}")
        where = {k: v for k, v in f["where"].items() if v}
        if where:
            lines.append("")
            for k, v in where.items():
                lines.append(f"- where ({esc(k)}): " + ", ".join(f"`{shorten(str(x), 120).replace('`', '')}`" for x in v[:8]))
        lines.append("")
    if d["kernels"]:
        lines += ["## Hot kernels", "", "| # | kernel | total ms | count | share % | tensor cores | op |", "|---:|---|---:|---:|---:|---|---|"]
        for i, k in enumerate(d["kernels"], 1):
            lines.append(
                f"| {i} | {esc(shorten(kernel_label(k['name']), 90))} | {fmt_num(k['total_ms'])} | {fmt_num(k['count'])} | "
                f"{fmt_num(k['share_pct'])} | {esc(k['tensor_cores'] or '-')} | {esc(k['op'] or '-')} |"
            )
        lines.append("")
    if d.get("kernel_verdicts"):
        lines += ["## Kernel deep dive (Nsight Compute)", "",
                  "| kernel | verdict | DRAM % | L2 % | tensor pipe % | % of roof | top stall |", "|---|---|---:|---:|---:|---:|---|"]
        for v in d["kernel_verdicts"]:
            m, roof = v["metrics"], v.get("roofline") or {}
            top = v["stalls"][0]["reason"] if v["stalls"] else "-"
            lines.append(
                f"| {esc(shorten(kernel_label(v['name']), 90))} | {esc(v['headline'])} | {fmt_num(m.get('dram_pct'))} | "
                f"{fmt_num(m.get('l2_pct'))} | {fmt_num(m.get('tensor_pipe_pct'))} | {fmt_num(roof.get('percent_of_roof'))} | {esc(top)} |"
            )
        lines.append("")
    if d.get("perf") and (d["perf"]["classes"] or d["perf"]["per_step"].get("model_flops")):
        from proflab.render.perf import perf_markdown

        lines += [*perf_markdown(d["perf"], esc), ""]
    if d.get("memory"):
        from proflab.render.memory import memory_markdown

        lines += [*memory_markdown(d["memory"], esc), ""]
    if d["missing"]:
        lines += ["## Missing signals", ""]
        for m in d["missing"]:
            lines.append(f"- **{esc(m['signal'])}**: {esc(m['reason'])}" + (f" (skipped: {esc(', '.join(m['skipped']))})" if m["skipped"] else ""))
        lines.append("")
    for n in d["notes"]:
        if n not in scope:
            lines.append(f"> note: {esc(n)}")
    return "\n".join(lines).rstrip() + "\n"


# -- comparisons ------------------------------------------------------------------------------
_VERDICT_MARK = {"improved": "✅ improved", "regressed": "❌ regressed", "no_change": "➖ no change", "unknown": "❔ unknown"}


def _pct(v) -> str:
    return "n/a" if v is None else f"{v:+.1f} %"


def _pct_or_na(v) -> str:
    return "n/a" if v is None else f"{fmt_num(v)} %"


def _ms(v) -> str:
    return "n/a" if v is None else f"{v:,.3f}"


def render_compare_markdown(comparison) -> str:
    """A comparison as a pull-request comment: the verdict first, then where time moved."""
    d = comparison.to_dict()
    s = d["step_time_ms"]
    lines = [f"## proflab compare: {_VERDICT_MARK[d['verdict']]}", ""]
    lines.append(f"**{esc(d['before']['label'])}** → **{esc(d['after']['label'])}**")
    lines.append("")
    ci = s["ci_pct"]
    side = {"gpu": "GPU-side", "unprofiled": "unprofiled (measured)"}.get(s.get("side"), s.get("side") or "n/a")
    lines += ["| | before | after | change | 95 % interval |", "|---|---:|---:|---:|---|"]
    lines.append(f"| median step ms ({esc(side)}) | {_ms(s['before'])} | {_ms(s['after'])} | {_pct(s['delta_pct'])} | "
                 + ("n/a" if ci is None else f"[{ci[0]:+.1f}, {ci[1]:+.1f}] %" if interval_says(d)
                    else esc(d["verdict_confidence"]["why"])) + " |")
    w = d.get("gpu_work_ms")
    if w:
        wci = w["ci_pct"]
        lines.append(f"| GPU work ms/step | {_ms(w['before'])} | {_ms(w['after'])} | {_pct(w['delta_pct'])} | "
                     + ("n/a" if wci is None else f"[{wci[0]:+.1f}, {wci[1]:+.1f}] %") + " |")
    e = d.get("energy")
    if e:
        lines.append(f"| energy J/step (NVML counter) | {fmt_num(e['before']['energy_per_step_j'])} | {fmt_num(e['after']['energy_per_step_j'])} | {_pct(e['delta_pct'])} | |")

    if (u := unprofiled_steps(d)) is not None:
        lines.append(f"| unprofiled step ms ({u[0]}) | {u[1]} | {u[2]} | | |")
    # the floor said once: in the reason where it decided, else after it
    floor = "" if "noise floor" in d["verdict_reason"] else f" Noise floor {fmt_num(d['noise_floor_pct'])} % ({esc(d['noise_floor_source'])})."
    lines += ["", f"{esc(d['verdict_reason'])}.{floor}", ""]
    parts = [r for r in d["breakdown_ms"] if r["before_ms"] or r["after_ms"]]
    if parts:
        lines += ["### Where the time moved (mean ms per step)", "", "| part | before | after | change | clear |", "|---|---:|---:|---:|---|"]
        for r in parts:
            lines.append(f"| {esc(r['part'])} | {_ms(r['before_ms'])} | {_ms(r['after_ms'])} | {r['delta_ms']:+,.3f} | {'yes' if r['clear'] else 'no'} |")
        lines.append("")
    pf = d.get("perf")
    if pf and pf["classes"]:
        m = pf["mfu_pct"]
        lines += ["### Where the FLOPs go: achieved TFLOPS by operator class", "",
                  f"MFU {_pct_or_na(m['before'])} -> {_pct_or_na(m['after'])}.", "",
                  "| class | TFLOPS before | TFLOPS after | change | GB/s before | GB/s after | ms/step before | ms/step after |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in pf["classes"]:
            lines.append(f"| {esc(r['class'])} | {fmt_num(r['before_tflops'])} | {fmt_num(r['after_tflops'])} | {_pct(r['tflops_change_pct'])} | "
                         f"{fmt_num(r['before_gbps'])} | {fmt_num(r['after_gbps'])} | {fmt_num(r['before_ms_per_step'])} | "
                         f"{fmt_num(r['after_ms_per_step'])} |")
        lines.append("")
    f = d["findings"]
    if any(f.values()):
        lines += ["### Findings", ""]
        for status, mark in (("resolved", "resolved"), ("new", "new"), ("persisting", "persisting")):
            for x in f[status]:
                gain = x["before_gain_pct"] if status == "resolved" else x["after_gain_pct"]
                lines.append(f"- **{mark}** `{x['id'].replace('`', '')}` [{x['severity']}]: {esc(x['title'])}"
                             + (f" (est. gain {fmt_num(gain)} %)" if gain is not None else ""))
        lines.append("")
    unit = "ms/step" if d["per"] == "step" else "ms (window)"
    if d["kernels"]:
        lines += [f"### Kernels ({unit}, largest change first)", "", "| kernel | before | after | change | |", "|---|---:|---:|---:|---|"]
        for k in d["kernels"][:15]:
            lines.append(f"| {esc(shorten(k['name'], 90))} | {_ms(k['before_ms'])} | {_ms(k['after_ms'])} | {k['delta_ms']:+,.3f} | {k['status']} |")
        ks = d["kernel_summary"]
        lines += ["", f"{ks['matched']} kernels matched, {len(ks['new'])} new, {len(ks['vanished'])} vanished.", ""]
    for title, key in (("Operators", "ops"), ("Ranges (NVTX / record_function)", "ranges")):
        rows = [r for r in d[key] if abs(r.get("delta_gpu_ms") or 0) > 0 or abs(r.get("delta_host_ms") or 0) > 0][:10]
        if rows:
            lines += [f"### {title} ({unit})", "", "| name | GPU before | GPU after | GPU change | host change | |", "|---|---:|---:|---:|---:|---|"]
            for r in rows:
                lines.append(f"| {esc(shorten(r['name'], 80))} | {_ms(r['before_gpu_ms'])} | {_ms(r['after_gpu_ms'])} | "
                             f"{r['delta_gpu_ms']:+,.3f} | {r['delta_host_ms']:+,.3f} | {r['status']} |")
            lines.append("")
    if d["environment"]:
        lines += ["### Environment differences", "", "| | before | after |", "|---|---|---|"]
        lines += [f"| {esc(r['key'])} | {esc(r['before'] or 'n/a')} | {esc(r['after'] or 'n/a')} |" for r in d["environment"]]
        lines.append("")
    for c in d["caveats"]:
        lines.append(f"> {esc(c)}")
    return "\n".join(lines).rstrip() + "\n"


def render_compare_html(comparison) -> str:
    """For Jupyter: the verdict line and the main tables (polars renders its own HTML)."""
    import html

    v, why = comparison.verdict
    s = comparison.step_time
    head = (f"<h4>proflab compare: {html.escape(_VERDICT_MARK[v])}</h4><p>{html.escape(comparison.before.label)} → "
            f"{html.escape(comparison.after.label)}: median step {_ms(s['before'])} → {_ms(s['after'])} ms "
            f"({_pct(s['delta_pct'])}); {html.escape(why)}</p>")
    parts = [head]
    for title, df in (("Where the time moved (ms/step)", comparison.breakdown), ("Findings", comparison.findings),
                      ("Kernels", comparison.kernels.head(10))):
        parts.append(f"<h5>{html.escape(title)}</h5>" + df._repr_html_())
    parts += [f"<p><i>{html.escape(c)}</i></p>" for c in comparison.caveats]
    return "\n".join(parts)

