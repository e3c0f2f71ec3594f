"""A trace larger than memory allows, analysed whole in parts: its peak against the budget.

The target (issue 54): a 10 GB trace analysed whole in parts (``proflab analyze --all-parts``,
every event, within the default memory budget of 1.5 GB) peaks at 1.5 GB at most. The trace is
``gen_realistic.py``'s at ``--size-mb`` (10,000 by default; generated once into ``--work``,
about 20 minutes), or ``--trace``. In a child process:

* **proflab**: ``python -m proflab analyze TRACE --all-parts --format json --no-cache`` with
  ``--memory-budget`` (the report to a file): wall seconds, CPU seconds, the peak RSS of the
  process and of it with any helper process together (sampled);
* **floor** (``--floor`` only): the decode floor of ``bench_scaling.py`` (msgspec decoding
  every event of the whole file at once, start-up included). At 10 GB it holds the file and
  ~28 M decoded events (~13 GB), so it is left out unless asked for; its time is then printed
  beside proflab's, with the ratio.

It prints the size, the events and parts the report counts, proflab's time and peak against
the budget, and whether the peak is within it.

Usage::

    python benchmarks/bench_parts.py                              # 10 GB, generated once
    python benchmarks/bench_parts.py --trace big.json --budget 1.5G --floor --json-out parts.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_real_traces import bytecode  # noqa: E402  (the package's bytecode, as installed)
from bench_scaling import _FLOOR, child  # noqa: E402  (the same floor and child measurement)


def size_bytes(text: str) -> int:
    units = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
    t = text.strip().lower().removesuffix("b")
    return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", type=Path, help="the trace (default: generated into --work)")
    ap.add_argument("--size-mb", type=float, default=10_000, help="the generated trace's size (default 10,000 MB)")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "proflab-parts")
    ap.add_argument("--budget", default="1.5G", help="--memory-budget, and the peak's target (default 1.5G)")
    ap.add_argument("--floor", action="store_true", help="also run the decode floor (holds the whole file; see above)")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    trace = args.trace
    if trace is None:
        import gen_realistic

        trace = args.work / f"realistic_{args.size_mb:g}mb.json"
        if not trace.exists():
            print(f"generating {trace} ...", flush=True)
            gen_realistic.main([str(trace), "--size-mb", str(args.size_mb)])
    bytecode()
    budget = size_bytes(args.budget)
    out = args.work / "report.json"
    size_mb = trace.stat().st_size / 1e6
    print(f"{trace} ({size_mb:,.0f} MB); --all-parts --memory-budget {args.budget} (target: peak <= {budget / 1e9:.2f} GB)", flush=True)
    cmd = [sys.executable, "-m", "proflab", "analyze", str(trace), "--all-parts", "--memory-budget", args.budget,
           "--format", "json", "--no-cache", "-o", str(out)]  # fmt: skip
    run = child(cmd, None, 0)
    if run["rc"] != 0:
        raise SystemExit(f"proflab failed ({run['rc']}): {run['stderr']}")
    rep = json.loads(out.read_text())
    src = rep["source"]["inputs"][0]
    events, parts = src.get("analysed_events", src.get("events")), src.get("parts", 1)
    peak_mb = max(run["peak_mib"], run["tree_peak_mib"]) * 2**20 / 1e6
    row = {"trace": str(trace), "size_mb": round(size_mb, 1), "events": events, "parts": parts, "budget": args.budget,
           "proflab": run, "peak_mb": round(peak_mb), "met": peak_mb <= budget / 1e6}  # fmt: skip
    print(f"{'':<8} {'wall s':>8} {'CPU s':>7} {'peak MB':>8} {'x floor':>7}")
    if args.floor:
        floor = child([sys.executable, "-c", _FLOOR, str(trace)], None, 0)
        row["floor"] = floor
        print(f"{'floor':<8} {floor['wall_s']:>8.2f} {floor['user_s'] + floor['sys_s']:>7.2f} {floor['peak_mib'] * 2**20 / 1e6:>8.0f}")
    ratio = f"{run['wall_s'] / row['floor']['wall_s']:.2f}" if args.floor and row["floor"]["rc"] == 0 else "-"
    print(f"{'proflab':<8} {run['wall_s']:>8.2f} {run['user_s'] + run['sys_s']:>7.2f} {peak_mb:>8.0f} {ratio:>7}")
    print(f"events {events}, parts {parts}; peak {peak_mb:,.0f} MB of the {budget / 1e6:,.0f} MB budget: "
          f"{'met' if row['met'] else 'NOT met'}")  # fmt: skip
    if args.json_out:
        args.json_out.write_text(json.dumps(row, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
