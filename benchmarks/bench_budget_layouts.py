"""Whether a stated memory budget holds for every layout of the same JSON trace (issue 54).

A trace saved again by another tool keeps its events and loses Kineto's text layout: one
compact event a line, ``json.dumps(indent=2)``, everything on one line, each of them gzipped.
``proflab analyze --memory-budget B`` reads the part of the trace that fits ``B`` and must peak
within 10 % of ``B`` whatever the layout. This writes the realistic trace (``gen_realistic.py``,
``--size-mb``) in each layout, plain and gzipped (level 1), runs ``proflab analyze TRACE
--memory-budget B --no-cache --format json`` on each in a child process, one after another, and
prints its wall time, its peak RSS (MB, 10^6 bytes, as the budget is stated; MiB beside it)
over the budget, how many events it analysed of how many, and whether it held.

Usage::

    python benchmarks/bench_budget_layouts.py                          # 185 MB, budget 400M
    python benchmarks/bench_budget_layouts.py --size-mb 185 --budget 400M --work /tmp/layouts
    python benchmarks/bench_budget_layouts.py --layouts kineto one_event_a_line --no-gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_scaling import child  # noqa: E402  (the same child measurement)

LAYOUTS = ("kineto", "one_event_a_line", "indent2", "one_line")
TOLERANCE = 1.10  # the bar: within 10 % of the budget


def _budget_bytes(text: str) -> int:
    sys.path.insert(0, str(HERE.parent / "src"))
    from proflab.cli._reading import budget_bytes

    b = budget_bytes(text)
    if b is None:
        raise SystemExit("a budget to hold is needed (not 'none')")
    return b


def write_layouts(source: Path, work: Path, layouts: tuple[str, ...], gz: bool) -> list[Path]:
    """``source`` (Kineto's layout) written again in each of ``layouts``, plain and (``gz``)
    gzipped; files already there are kept."""
    out: list[Path] = []
    wanted = [(name, z) for name in layouts for z in ((False, True) if gz else (False,))]
    missing = [(n, z) for n, z in wanted if not (work / _name(n, z)).exists()]
    doc = json.loads(source.read_bytes()) if any(n != "kineto" for n, _ in missing) else None
    for name, z in wanted:
        path = work / _name(name, z)
        out.append(path)
        if path.exists():
            continue
        opener = (lambda p: gzip.open(p, "wb", compresslevel=1)) if z else (lambda p: open(p, "wb"))
        tmp = path.with_suffix(path.suffix + ".part")
        with opener(tmp) as f:
            if name == "kineto":
                with open(source, "rb") as src:
                    while chunk := src.read(1 << 24):
                        f.write(chunk)
            else:
                for piece in _text(doc, name):
                    f.write(piece.encode())
        tmp.rename(path)
    return out


def _name(layout: str, gz: bool) -> str:
    return f"{layout}.json" + (".gz" if gz else "")


def _text(doc: dict, layout: str):
    """The document in ``layout``, a piece at a time."""
    if layout == "indent2":
        yield json.dumps(doc, indent=2)
    elif layout == "one_line":
        yield json.dumps(doc, separators=(",", ":"))
    elif layout == "one_event_a_line":
        rest = {k: v for k, v in doc.items() if k != "traceEvents"}
        yield json.dumps(rest)[:-1] + ', "traceEvents": [\n'
        events = doc["traceEvents"]
        for i, e in enumerate(events):
            yield json.dumps(e, separators=(",", ":")) + (",\n" if i + 1 < len(events) else "\n")
        yield "]}"
    else:
        raise ValueError(layout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=185, help="the realistic trace's size (gen_realistic.py)")
    ap.add_argument("--budget", default="400M", help="the memory budget to hold (proflab's --memory-budget)")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "proflab-layouts")
    ap.add_argument("--layouts", nargs="*", default=list(LAYOUTS), choices=LAYOUTS)
    ap.add_argument("--no-gz", action="store_true", help="plain files only")
    a = ap.parse_args(argv)
    budget = _budget_bytes(a.budget)
    a.work.mkdir(parents=True, exist_ok=True)
    source = a.work / f"realistic_{a.size_mb}mb.json"
    if not source.exists():
        subprocess.run([sys.executable, str(HERE / "gen_realistic.py"), str(source), "--size-mb", str(a.size_mb)], check=True)
    files = write_layouts(source, a.work, tuple(a.layouts), not a.no_gz)
    print(f"budget {a.budget} ({budget / 1e6:.0f} MB); the bar: a peak within {TOLERANCE:.2f}x of it")
    print(f"{'layout':24s} {'file MB':>8s} {'wall s':>7s} {'peak MB':>8s} {'peak MiB':>9s} {'x budget':>9s} {'events':>19s} held")
    held = 0
    for path in files:
        out = a.work / (path.name + ".report.json")
        r = child([sys.executable, "-m", "proflab", "analyze", str(path), "--memory-budget", a.budget, "--no-cache",
                   "--format", "json", "-o", str(out)], None, 0)
        peak = max(r["peak_mib"], r["tree_peak_mib"]) * 2**20
        events = "-"
        if r["rc"] in (0, 1) and out.exists():
            (src,) = (json.loads(out.read_text()).get("source") or {}).get("inputs") or [{}]
            events = f"{src.get('analysed_events', src.get('events', '?'))}/{src.get('events', '?')}"
        ok = r["rc"] in (0, 1) and peak <= TOLERANCE * budget
        held += ok
        print(f"{path.name:24s} {path.stat().st_size / 1e6:8.0f} {r['wall_s']:7.2f} {peak / 1e6:8.0f} {peak / 2**20:9.0f} "
              f"{peak / budget:9.2f} {events:>19s} {'yes' if ok else 'NO'}" + (f"  (exit {r['rc']}: {r['stderr']})" if r["rc"] not in (0, 1) else ""))
    print(f"held on {held} of {len(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
