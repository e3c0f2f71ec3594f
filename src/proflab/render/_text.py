"""Small text helpers shared by the renderers (terminal, Markdown, memory, job), so that none of
them imports another's privates."""

from __future__ import annotations

import re
from typing import Any

from proflab._controls import escape
from proflab.analysis.labels import kernel_label  # the renderers' label for a kernel name

__all__ = ["interval_says", "shorten", "shorten_middle", "fmt_num", "fmt_bytes", "fmt_flops", "flops_scale", "evidence_lines", "evidence_items",
           "evidence_label", "evidence_value", "evidence_row_text", "evidence_table_rows", "evidence_markdown", "kernel_label", "is_scope_note", "printable", "esc",
           "unprofiled_steps", "gain_text", "combined_text", "compiled_text", "inference_lines", "glue_units", "UNIT_GLUE"]


def printable(obj: Any) -> Any:
    """``obj`` (a report's dict) with every control character in its text shown as an escape
    (``\\x1b``): names come from traces, and a terminal or page must show them, not obey them."""
    if isinstance(obj, str):
        return escape(obj)
    if isinstance(obj, dict):
        return {printable(k): printable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [printable(v) for v in obj]
    return obj


def is_scope_note(note: str) -> bool:
    """A reader note saying what the report covers when it is not what the user may assume:
    a trace that is not a GPU trace proflab diagnoses (CPU-only, another accelerator), or a
    trace analysed in a part for the memory budget. Reports show it right under their header."""
    return note.startswith(("the trace holds ", "the trace also holds ", "memory budget: "))


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "n/a"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n} B"



def shorten(name: str | None, width: int) -> str:
    if name is None:
        return "-"
    name = " ".join(str(name).split())
    return name if len(name) <= width else name[: max(width - 1, 1)] + "…"


def shorten_middle(name: str | None, width: int) -> str:
    """``name`` cut in the middle to ``width``: its start and its end stay, so names that
    differ only at the end (``…_coopA_NNT``, ``…_coopA_NTT``: the same kernel family, two
    layouts) stay distinct, where an end cut printed them alike."""
    if name is None:
        return "-"
    name = " ".join(str(name).split())
    if len(name) <= width:
        return name
    if width < 8:
        return shorten(name, width)
    tail = (width - 1) * 2 // 5
    return name[: width - 1 - tail] + "…" + name[len(name) - tail:]


def fmt_flops(flops: float | None, unit: str = "FLOP") -> str:
    """``flops`` scaled so that it reads as a number, never as 0: 38.786 TFLOP, 136.2 MFLOP
    (``unit`` "FLOP/s" for a rate)."""
    if flops is None:
        return "n/a"
    scale, prefix = flops_scale(abs(flops))
    return f"{fmt_num(round(flops / scale, 3))} {prefix}{unit}"


def flops_scale(flops: float) -> tuple[float, str]:
    """The scale and prefix for ``flops`` (FLOP or FLOP/s): T, G, M, k or none."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if flops >= scale:
            return scale, prefix
    return 1.0, ""


# A number and its unit stay on one line: the terminal wraps at spaces, and "median 34.925 /
# ms" once split across two. The glue is a private-use character, one cell wide, made a
# plain space after wrapping (rich breaks at a no-break space as at any other).
UNIT_GLUE = "\ue000"
_UNITS = r"(?:ms|us|µs|ns|s|%|GB/s|GB|MB|KB|MiB|GiB|KiB|B|TFLOPS|GFLOPS|MFLOPS|TFLOP|GFLOP|MFLOP|kFLOP|FLOP|W|J|MHz|SMs|CUs)"
_NUM_UNIT = re.compile(r"(?<![\w.])(-?\d[\d,]*(?:\.\d+)?(?:-\d[\d,]*(?:\.\d+)?)?) (" + _UNITS + r")(?![\w/])")


def glue_units(text: str) -> str:
    """``text`` with each number joined to the unit after it by :data:`UNIT_GLUE`."""
    return _NUM_UNIT.sub(lambda m: m.group(1) + UNIT_GLUE + m.group(2), text)


def fmt_num(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.3f}".rstrip("0").rstrip(".") if abs(v) < 1000 else f"{v:,.1f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


# Units named by a word of an evidence key (``sync_idle_ms``, ``gpu_busy_pct_by_device``):
# the key's words without it are the label, the unit goes after the value.
_KEY_UNITS = {"ms": "ms", "us": "us", "ns": "ns", "s": "s", "pct": "%", "gbps": "GB/s", "tflops": "TFLOPS", "mib": "MiB",
              "gib": "GiB", "w": "W", "j": "J", "mhz": "MHz", "bytes": "bytes", "flops": "FLOP"}
# the key that names what a row of a table of evidence is about: its value goes first, bare
_ROW_NAMES = ("name", "call", "kernel", "op", "what", "cause", "part", "rank")


def evidence_label(key: str) -> tuple[str, str | None]:
    """A human label and the unit of an evidence key: ``sync_idle_ms`` -> ("sync idle", "ms"),
    ``idle_pct_of_window`` -> ("idle", "% of the window"), ``launch_idle_ms_range`` ->
    ("launch idle range", "ms"), ``syncs_per_step`` -> ("syncs per step", None)."""
    words = str(key).split("_")
    unit = None
    if len(words) == 1 and words[0] in _KEY_UNITS:  # the key is its unit ("bytes")
        return words[0], _KEY_UNITS[words[0]]
    if words[0] == "pct" and words[1:2] == ["of"] and len(words) > 2:  # pct_of_gap_time: a share of it
        return "share", "% of the " + " ".join(words[2:])
    for i, w in enumerate(words):
        if w in _KEY_UNITS and i > 0:
            unit = _KEY_UNITS[w]
            rest = words[i + 1:]
            if unit == "%" and rest[:1] == ["of"] and len(rest) > 1:  # a share of something: said with the unit
                unit, rest = "% of the " + " ".join(rest[1:]), []
            words = words[:i] + rest
            break
    label = " ".join(w for w in words if w) or str(key)
    return label, unit


def _with_unit(v: Any, unit: str | None) -> str:
    if unit == "bytes" and isinstance(v, (int, float)) and not isinstance(v, bool):
        return fmt_bytes(int(v))
    if unit == "FLOP" and isinstance(v, (int, float)) and not isinstance(v, bool):
        return fmt_flops(v)
    text = fmt_num(v)
    if unit is None or v is None or not isinstance(v, (int, float)) or isinstance(v, bool):
        return text
    return f"{text}{unit}" if unit.startswith("%") else f"{text} {unit}"


def evidence_value(value: Any, unit: str | None) -> str:
    """A scalar, a range or a list of evidence with its unit: ``[44.944, 44.944]`` ms is one
    value, ``44.944 ms``; ``[8.254, 50.806]`` a range, ``8.254-50.806 ms``."""
    if isinstance(value, list):
        nums = [v for v in value if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(value) == 2 and len(nums) == 2 and unit not in ("bytes", "FLOP"):
            if value[0] == value[1]:
                return _with_unit(value[0], unit)
            return _with_unit(value[0], None) + "-" + _with_unit(value[1], unit)
        return ", ".join(_with_unit(v, unit) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_with_unit(v, unit)}" for k, v in value.items())
    return _with_unit(value, unit)


def evidence_row_text(row: dict[str, Any]) -> str:
    """One row of a table of evidence in words: its name first, then ``label value unit``."""
    name_key = next((k for k in _ROW_NAMES if isinstance(row.get(k), str)), None)
    bits = [str(row[name_key])] if name_key else []
    for k, v in row.items():
        if k == name_key or v is None or v == "" or v == [] or v == {}:
            continue
        label, unit = evidence_label(k)
        bits.append(f"{label} {evidence_value(v, unit)}")
    return ", ".join(bits)


def evidence_items(evidence: dict[str, Any]) -> list[tuple[str, str | list[dict[str, Any]]]]:
    """The evidence as (label, value in words) pairs, or (label, rows) for a table of rows;
    empty values left out (an absent signal is the report's "missing", not an empty key)."""
    out: list[tuple[str, Any]] = []
    for key, value in evidence.items():
        if value is None or value == "" or value == [] or value == {}:
            continue
        label, unit = evidence_label(key)
        if isinstance(value, list) and isinstance(value[0], dict):
            out.append((label, value))
        else:
            out.append((label, evidence_value(value, unit)))
    return out


def evidence_lines(evidence: dict[str, Any], width: int = 76) -> list[str]:
    """``label: value unit`` lines; a table of rows as its label and one indented line a row
    (a row is left whole, to wrap: cut, it lost the unit of its last number)."""
    out: list[str] = []
    for label, value in evidence_items(evidence):
        if isinstance(value, list):
            out.append(f"{label}:")
            for row in value[:5]:
                out.append("  " + shorten(evidence_row_text(row), 3 * width))
        else:
            out.append(shorten(f"{label}: {value}", 2 * width))
    return out


def observer_line(summary: dict) -> str | None:
    """One line on the profiler's own cost and the unprofiled step (``summary.observer``),
    when the profiled step differs from the GPU work by more than 10%."""
    o = summary.get("observer")
    if not o or o["gpu_step_ms"] <= 1.10 * o["gpu_work_ms"]:
        return None
    u0, u1 = o["unprofiled_step_ms"]
    unprof = f"{fmt_num(u0)} ms measured" if o["source"] == "measured" else f"{fmt_num(u0)}-{fmt_num(u1)} ms estimated"
    return (
        f"Without the profiler: step {unprof}, GPU work {fmt_num(o['gpu_work_ms'])} ms/step; the profiler's host cost "
        f"{fmt_num(o['profiler_cost_ms_lo'])}-{fmt_num(o['profiler_cost_ms_hi'])} ms/step"
    )


# Enough to keep names from becoming markup, links or HTML; readable in raw form too. ">"
# stays itself ("->" read "-&gt;"): with "<" escaped no tag can open, and a ">" that would
# start a quote is escaped where it starts the text.
_MD_SPECIAL = str.maketrans({"\\": "\\\\", "`": "\\`", "*": "\\*", "_": "\\_", "[": "\\[", "]": "\\]",
                             "|": "\\|", "<": "&lt;", "&": "&amp;"})


def esc(text) -> str:
    """``text`` on one line, its Markdown and HTML specials escaped (a name taken from a trace)."""
    out = str(text).translate(_MD_SPECIAL).replace("\n", " ")
    return "\\" + out if out.lstrip().startswith(">") else out


def evidence_table_rows(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """A table of evidence rows as (headers, cells): each header a label with its unit
    (``idle ms``), each cell the value alone."""
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys and any(r.get(k) not in (None, "", [], {}) for r in rows)]
    heads, units = [], []
    for k in keys:
        label, unit = evidence_label(k)
        heads.append(label if unit in (None, "bytes", "FLOP") else f"{label} {unit}")
        units.append(unit if unit in ("bytes", "FLOP") else None)
    cells = [[evidence_value(r.get(k), u) if r.get(k) is not None else "" for k, u in zip(keys, units)] for r in rows]
    return heads, cells


def unprofiled_steps(d: dict) -> tuple[str, str, str] | None:
    """Run directories: each side's step without the profiler, as (kind, before, after) in
    ms (the observer's estimated range, or a measured value)."""
    if not (d["before"]["run_dir"] or d["after"]["run_dir"]):
        return None
    u = d.get("unprofiled_step_ms") or {}
    rows = (u.get("before") or []) + (u.get("after") or [])
    kind = "measured" if rows and all(r["source"] == "measured" for r in rows) else "estimated"

    def side(rows):
        if not rows:
            return "n/a"
        lo, hi = min(r["range_ms"][0] for r in rows), max(r["range_ms"][1] for r in rows)
        return fmt_num(lo) if lo == hi else f"{fmt_num(lo)}-{fmt_num(hi)}"

    return kind, side(u.get("before")), side(u.get("after"))


def gain_text(f: dict, per: str | None = "step") -> str:
    """A finding's gain in words: what its fix is predicted to save, per step or over the
    window, and how (the step replayed with the fix, or the idle time it claims)."""
    p = f.get("prediction") or {}
    if p.get("model") == "none":
        return p.get("why") or "no gain is predicted"
    unit = "a step" if per == "step" else "over the window"
    how = ("replayed" if p.get("model") == "replay" else "from the work ratio" if p.get("model") == "work ratio"
           else "from idle time" if p else "estimated")
    # (a replayed gain is a share of the bare step; an idle-time one of the profiled window it was idle in)
    share = "of the bare step" if per == "step" and how == "replayed" else "of the window"
    text = f"predicted ({how}): saves {fmt_num(f['est_gain_ms'])} ms {unit} ({fmt_num(f['est_gain_pct'])}% {share})"
    rng = p.get("predicted_gain_range_ms")
    if p.get("bare_step_source") == "estimated" and rng and rng[0] != rng[1]:
        text += f", {fmt_num(rng[0])}-{fmt_num(rng[1])} ms over the profiler's plausible cost"
    held = p.get("held_gain_ms")  # (a host fix without a measured step: what holds at the fastest plausible step)
    if held is not None and fmt_num(held) != fmt_num(f["est_gain_ms"]):
        text += f" (the severity judged on the {fmt_num(held)} ms that hold at the fastest plausible bare step)"
    if f.get("overlaps"):
        text += f"; overlaps {', '.join(f['overlaps'])}"
    return text


def combined_text(summary: dict) -> str | None:
    """The report's combined prediction in words: all replayed fixes made together."""
    p = summary.get("predicted") or {}
    if "predicted_gain_ms" not in p:
        return None
    n = len(p["findings"])
    step = (f"predicted {fmt_num(p['bare_step_ms'])} -> {fmt_num(p['predicted_step_ms'])} ms a step "
            f"({fmt_num(p['predicted_gain_pct'])}% saved; bare step {p['bare_step_source']})")  # fmt: skip
    if n == 1:
        return f"With the one fix made: {step}; GPU work left {fmt_num(p['gpu_work_after_ms'])} ms"
    return (
        f"All {n} fixes together: {step}, against {fmt_num(p['sum_of_findings_ms'])} ms if their gains simply added; "
        f"GPU work left {fmt_num(p['gpu_work_after_ms'])} ms"
    )


def compiled_text(summary: dict) -> str | None:
    """What torch.compile and CUDA graphs did, in one line (``summary["compiled"]``)."""
    c = summary.get("compiled")
    if not c:
        return None
    per = c.get("launches_per_step") or {}
    kms = c.get("kernel_ms") or {}
    said = []
    if c.get("regions"):
        ids = ", ".join(i for ids in (c.get("frames") or {}).values() for i in ids)
        said.append(f"{fmt_num(c['regions'])} compiled region calls" + (f" ({ids})" if ids else "")
                    + (f", {fmt_num(c['in_regions_pct'])}% of kernel time inside them" if c.get("in_regions_pct") is not None else ""))
    if c.get("graphed"):
        share = f" ({fmt_num(round(100 * kms['graphed'] / kms['all'], 1))}% of kernel time)" if kms.get("all") else ""
        what = "CUDA graphs replayed" if c.get("regions") else "replayed"
        said.append(f"{what} {fmt_num(per.get('graph_replays'))} a step{share}" if per.get("graph_replays") is not None
                    else f"{what} {fmt_num(c['launches']['graph_replays'])} times{share}")
    elif c.get("regions") and (c.get("kernels") or {}).get("all"):
        said.append("no CUDA graph replays")
    if c.get("regions") and per.get("outside") is not None and (c.get("kernels") or {}).get("all"):
        said.append(f"launches a step: {fmt_num(per.get('in_regions'))} inside the regions, {fmt_num(per.get('outside'))} outside")
    if c.get("host_outside_ms_per_step") is not None and c.get("regions"):
        said.append(f"host time outside them {fmt_num(c['host_outside_ms_per_step'])} ms a step (profiled)")
    eager = c.get("eager_ops") or []
    if eager:
        said.append("eager kernels outside: " + ", ".join(f"{o['op']} {fmt_num(o['kernel_ms'])} ms" for o in eager[:3]))
    rec = c.get("record") or {}
    said += [f"{rec[k]} {w}" for k, w in (("graph_break_count", "graph breaks"), ("recompile_count", "recompiles"),
                                          ("cudagraph_skip_count", "CUDA graph skips")) if rec.get(k)]
    return ("Compiled: " if c.get("regions") or c.get("compiled") else "CUDA graphs: ") + "; ".join(said)


def evidence_markdown(evidence: dict) -> list[str]:
    """A finding's evidence as a table of labelled values (units with the values), and each
    table of rows in it (the syncs' calls, the host's work in the gaps) as a table of its own."""
    items = [(k, v) for k, v in evidence_items(evidence) if k != "proflab try"]  # (the fix says it)
    if not items:
        return []
    scalars = [(k, v) for k, v in items if not isinstance(v, list)]
    out = ["| evidence | value |", "|---|---|", *(f"| {esc(k)} | {esc(v)} |" for k, v in scalars), ""] if scalars else []
    for label, rows in ((k, v) for k, v in items if isinstance(v, list)):
        heads, cells = evidence_table_rows(rows[:10])
        out += [f"*{esc(label)}*", "", "| " + " | ".join(esc(h) for h in heads) + " |", "|" + "---|" * len(heads)]
        out += ["| " + " | ".join(esc(c) for c in row) + " |" for row in cells]
        out.append("")
    return out


def inference_lines(summary: dict) -> list[str]:
    """A generation loop's figures in a few lines (``summary["inference"]``): phases, latency
    (profiled, with its convention), decode bandwidth and MBU, prefill MFU, the KV cache."""
    inf = summary.get("inference")
    if not inf:
        return []
    lat, util, mem = inf.get("latency") or {}, inf.get("utilisation") or {}, inf.get("memory") or {}
    ph = inf.get("phases") or {}
    n = lambda v, unit="": "n/a" if v is None else f"{fmt_num(v)}{unit}"  # noqa: E731
    lines = [f"Inference: {fmt_num(inf['forwards'])} forwards in {fmt_num(inf['generations'])} generation(s), "
             f"{fmt_num(ph.get('prefill', 0))} prefill + {fmt_num(ph.get('decode', 0))} decode (phases from {inf['phases_from']})"
             + (f", batch {lat['batch']}" if lat.get("batch") else "")
             + (f"; {fmt_num(inf['recomputed_forwards'])} decode forwards recomputed their context" if inf.get("recomputed_forwards") else "")]
    lines.append(f"  {lat.get('timing', 'profiled')}: TTFT {n(lat.get('ttft_ms'), ' ms')}, TPOT {n(lat.get('tpot_ms'), ' ms')} "
                 f"(ITL median {n(lat.get('itl_median_ms'), ' ms')}, p90 {n(lat.get('itl_p90_ms'), ' ms')}), "
                 f"end-to-end {n(lat.get('e2e_ms'), ' ms')}, {n(lat.get('output_tokens_per_s'))} output tokens/s")
    rng = lat.get("unprofiled_itl_median_ms_range")
    if rng:
        ttft = lat.get("unprofiled_ttft_ms_range")
        central = ", ".join(text for key, text in (
            ("unprofiled_ttft_ms", f"TTFT {n(lat.get('unprofiled_ttft_ms'), ' ms')}"),
            ("unprofiled_tpot_ms", f"TPOT {n(lat.get('unprofiled_tpot_ms'), ' ms')}"),
            ("unprofiled_output_tokens_per_s", f"{n(lat.get('unprofiled_output_tokens_per_s'))} output tokens/s"))
            if lat.get(key) is not None)
        lines.append("  unprofiled (estimated): " + (f"{central}; " if central else "")
                     + f"inter-token {fmt_num(rng[0])}-{fmt_num(rng[1])} ms"
                     + (f", TTFT {fmt_num(ttft[0])}-{fmt_num(ttft[1])} ms" if ttft else "")
                     + (f"; {fmt_num(lat['host_slowed_tokens'])} tokens on a slowed host counted at the usual token's time"
                        if lat.get("host_slowed_tokens") else ""))
    dec, pre = util.get("decode") or {}, util.get("prefill") or {}
    if dec:
        b = (dec.get("weight_bytes_per_forward") or 0) + (dec.get("kv_bytes_per_forward") or 0)
        lines.append(f"  decode reads {fmt_bytes(b)} a token (weights + KV): {n(dec.get('achieved_gbps'), ' GB/s')}"
                     + (f", MBU {fmt_num(dec['mbu_pct'])}% of {fmt_num(dec['hbm_peak_gbps'])} GB/s" if dec.get("mbu_pct") is not None else ", MBU n/a (no device peak)")
                     + (f"; GPU busy {fmt_num(dec['gpu_busy_pct'])}% of each token" if dec.get("gpu_busy_pct") is not None else ""))
    if pre:
        lines.append(f"  prefill: {n(pre.get('achieved_tflops'), ' TFLOP/s')}"
                     + (f", MFU {fmt_num(pre['mfu_pct'])}%" if pre.get("mfu_pct") is not None else ", MFU n/a (no device peak)")
                     + f" ({pre.get('time_basis')})")
    if mem.get("kv_cache_bytes") is not None:
        lines.append(f"  KV cache: {fmt_bytes(mem['kv_cache_bytes'])} at {fmt_num(mem['kv_len'])} tokens"
                     + (" (static: allocated up front)" if mem.get("static") else f", +{fmt_bytes(mem['growth_bytes_per_token'])} a token"))
    elif mem.get("why"):
        lines.append(f"  KV cache: {mem['why']}")
    return lines


def interval_says(d: dict) -> bool:
    """Whether a comparison's (``to_dict``) interval of the step's change is worth printing: it
    is clear of 0, or there are runs enough a side to measure how runs differ. Otherwise its
    width is that of Student's t with a degree of freedom or two, or of an assumed drift, and
    the verdict's confidence is said instead."""
    lo, hi = d["step_time_ms"]["ci_pct"]
    return d["verdict_confidence"]["level"] == "high" or lo > 0 or hi < 0
