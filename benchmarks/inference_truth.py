"""What ``proflab analyze`` reports of a ``generate()`` loop, against the same loop timed bare.

    python benchmarks/inference_truth.py [--data tests/data/inference/h100 tests/data/inference/h100-rounds ...]

Each case of ``truth.json`` (recorded by ``tests/data/record/record_inference.py``: Hugging Face
``generate()`` from config, timed bare with CUDA events on a streamer's tokens, then once under
torch.profiler with shapes) is analysed as a plain trace. The table sets the report's latency
beside the bare medians: time to first token (TTFT), time per output token (TPOT, NVIDIA's
convention) and output tokens/s, each as the profiled run measured it and as the report's
unprofiled estimate: the profiler's per-event cost measured from the trace
(``analysis.timeline.event_cost``: its gaps' and no-work operators' means) taken off each
token's host events, replayed against its kernels (``inference.replayed_latency``), and the
range the cost's ends give for the median inter-token latency. The issue's bar:
within 10 % of the bare figure. The sets were recorded with ``TEARDOWN_CUPTI=1``: no bare round
runs with CUPTI left attached by the profiled one. ``h100-heldout`` was recorded after the
estimate was set (the first set's model at batch 1 and 8, on another H100) and analysed once.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rows(data: Path) -> list[dict]:
    import proflab

    out = []
    for case in json.loads((data / "truth.json").read_text())["cases"]:
        name, bare = case["case"], case["bare_median"]
        trace = next((t for t in (data / f"{name}.pt.trace.json.xz", data / f"{name}.pt.trace.json.gz") if t.exists()), None)
        if trace is None:
            print(f"{name}: bare timings only (its trace is not kept in the repository)", file=sys.stderr)
            continue
        rep = proflab.analyze(proflab.load(trace))
        lat = (rep.summary.get("inference") or {}).get("latency") or {}
        lo, hi = lat.get("unprofiled_itl_median_ms_range") or (None, None)
        out.append({"case": name, "bare_ttft_ms": bare["ttft_ms"], "bare_tpot_ms": bare["tpot_ms"],
                    "bare_tokens_per_s": bare["output_tokens_per_s"], "ttft_ms": lat.get("ttft_ms"),
                    "tpot_ms": lat.get("tpot_ms"), "tokens_per_s": lat.get("output_tokens_per_s"),
                    "unprofiled_itl_ms": (lo, hi), "est_ttft_ms": lat.get("unprofiled_ttft_ms"),
                    "est_tpot_ms": lat.get("unprofiled_tpot_ms"), "est_tokens_per_s": lat.get("unprofiled_output_tokens_per_s")})
        r = out[-1]
        r["within"] = {k: r[f"est_{k}"] is not None and abs(r[f"est_{k}"] / r[f"bare_{k}"] - 1) <= 0.10
                       for k in ("ttft_ms", "tpot_ms", "tokens_per_s")}
    return out


def _f(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = ROOT / "tests" / "data" / "inference"
    ap.add_argument("--data", nargs="*", default=[str(here / "h100"), str(here / "h100-rounds"), str(here / "h100-heldout")],
                    help="folders of traces and their truth.json (default: the three H100 sets)")
    a = ap.parse_args(argv)
    for data in a.data:
        _table(Path(data))
    return 0


def _table(data: Path) -> None:
    print(f"\n{data.name}\n")
    print("| case | TTFT ms: bare / profiled / unprofiled est. | TPOT ms: bare / profiled / unprofiled est. (ITL range) "
          "| tokens/s: bare / profiled / unprofiled est. | within 10%: TTFT, TPOT, tokens/s |")
    print("|---|---|---|---|---|")
    table = rows(data)
    for r in table:
        ilo, ihi = r["unprofiled_itl_ms"]
        print(f"| {r['case']} | {_f(r['bare_ttft_ms'])} / {_f(r['ttft_ms'])} / {_f(r['est_ttft_ms'])} | "
              f"{_f(r['bare_tpot_ms'], '.3f')} / {_f(r['tpot_ms'], '.3f')} / {_f(r['est_tpot_ms'], '.3f')} "
              f"({_f(ilo, '.3f')}-{_f(ihi, '.3f')}) | {_f(r['bare_tokens_per_s'], '.0f')} / {_f(r['tokens_per_s'], '.0f')} / "
              f"{_f(r['est_tokens_per_s'], '.0f')} | {', '.join('yes' if v else 'NO' for v in r['within'].values())} |")
    for k in ("ttft_ms", "tpot_ms", "tokens_per_s"):
        print(f"{k}: {sum(r['within'][k] for r in table)} of {len(table)} within 10% of the bare figure")


if __name__ == "__main__":
    sys.exit(main())
