"""Child process for bench_vs_hta.py: time HTA 0.5.0 on one trace directory.

Runs inside HTA's own virtual environment::

    .venv-hta/bin/python _hta_run.py TRACE_DIR RESULT_JSON

and writes the phase times (seconds), its own peak RSS (KiB) and a short
summary of the results to RESULT_JSON.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from typing import Any


def summarize(df: Any) -> Any:
    """A small, JSON-able view of an HTA result frame (or None)."""
    if df is None:
        return None
    return json.loads(df.head(8).to_json(orient="records"))


def main(trace_dir: str, out_path: str) -> None:
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    from hta.trace_analysis import TraceAnalysis

    times["import"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    analyzer = TraceAnalysis(trace_dir=trace_dir)
    times["load"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    temporal = analyzer.get_temporal_breakdown(visualize=False)
    times["temporal"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    idle, _idle_stats = analyzer.get_idle_time_breakdown(visualize=False)
    times["idle_time"] = time.perf_counter() - t0

    result = {
        "times_s": times,
        "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "events": int(sum(len(df) for df in analyzer.t.get_all_traces().values())),
        "temporal_breakdown": summarize(temporal),
        "idle_time_breakdown": summarize(idle),
    }
    with open(out_path, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
