"""A real recorded trace with attacker-controlled names: the kernels, operators and NVTX /
record_function ranges of ``tests/data/kineto/starved_input`` renamed to markup, quotes,
bidirectional overrides and control characters. Everything else (times, ids, devices) is the
recording's own, so every analysis and chart runs on it as on the original."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "data" / "kineto" / "starved_input.pt.trace.json.gz"

# No parentheses: kernel labels cut a trailing parameter list, and these must stay whole.
HOSTILE = [
    "<script>window.__pwned='script'</script>kernel_a",
    "<img src=x onerror=\"window.__pwned='img'\">kernel_b",
    "\"'><svg onload=window.__pwned='svg'>kernel_c",
    "</script><!--kernel_d-->&amp;&lt;",
    "rtl_\u202ekernel_e\u202c_\u2067isolate\u2069",
    "ctrl_\x07bell_\x1b[31mred_\x00nul_kernel_f",
    "line\u2028sep\u2029kernel_g",
]
RANGES = ["<script>window.__pwned='range'</script>", "<b onmouseover=alert(1)>range</b>", "range_\u202etxt.exe"]


def hostile_trace(dest: Path, source: Path = SOURCE) -> Path:
    """Write the renamed copy of ``source`` to ``dest`` (.json.gz) and return it."""
    data = json.loads(gzip.decompress(source.read_bytes()))
    events = data["traceEvents"]
    kernels: dict[str, int] = {}
    for e in events:
        if e.get("cat") == "kernel":
            kernels[e["name"]] = kernels.get(e["name"], 0) + int(e.get("dur", 0))
    ranked = sorted(kernels, key=lambda n: -kernels[n])
    rename = {name: HOSTILE[i % len(HOSTILE)] + ("" if i < len(HOSTILE) else f"_{i}") for i, name in enumerate(ranked)}
    ranges: dict[str, str] = {}
    ops: dict[str, str] = {}
    for e in events:
        cat, name = e.get("cat"), e.get("name")
        if cat == "kernel":
            e["name"] = rename[name]
        elif cat in ("user_annotation", "gpu_user_annotation") and not str(name).startswith("ProfilerStep#"):
            e["name"] = ranges.setdefault(name, RANGES[len(ranges) % len(RANGES)] + (f"_{len(ranges)}" if len(ranges) >= len(RANGES) else ""))
        elif cat == "cpu_op" and name in ("aten::copy_", "aten::addmm", "aten::convolution"):
            e["name"] = ops.setdefault(name, f"<iframe srcdoc='x'>{name}</iframe>")
    dest.write_bytes(gzip.compress(json.dumps(data, ensure_ascii=False).encode("utf-8")))
    return dest
