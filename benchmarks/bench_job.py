"""A job of many ranks on Dask: 1 worker against 2, wall time and peak memory per worker.

The rank traces are scaled from the real 2x H200 DDP run in tests/data/runs/ (its two rank
traces, each laid out over more steps by gen_kineto.py, then copied to N ranks with their
``distributedInfo`` rank and world size set): every rank is a real trace's content, the
collectives match across ranks by construction.

    python benchmarks/bench_job.py                    # 8 ranks of 40 steps (modest: a 2-core machine)
    python benchmarks/bench_job.py --ranks 32 --steps 200

For each worker count a ``LocalCluster`` (one thread per worker process) is started, the job
is analysed through ``analyze_job(..., scheduler=ADDRESS)`` (the path ``proflab analyze
--scheduler`` takes), and each worker reports its own peak RSS (``VmHWM``). The
projection to a cluster at the end is arithmetic on the measured per-rank cost, stated as
such, not a measurement.
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
RUN = HERE.parent / "tests" / "data" / "runs" / "20261122-082928-h200x2_ddp" / "traces"


def make_ranks(out: Path, ranks: int, steps: int, source: Path = RUN) -> list[Path]:
    from gen_kineto import generate

    sources = sorted(source.glob("rank*.pt.trace.json.gz"))
    if not sources:
        raise SystemExit(f"{source}: no rank*.pt.trace.json.gz here")
    scaled = []
    for i, src in enumerate(sources):
        dst = out / f"scaled{i}.json"
        generate(src, dst, steps=steps)
        scaled.append(json.loads(dst.read_text()))
        dst.unlink()
    paths = []
    for r in range(ranks):
        doc = scaled[r % len(scaled)]
        doc["distributedInfo"] = {**doc.get("distributedInfo", {}), "rank": r, "world_size": ranks}
        p = out / f"rank{r}.pt.trace.json.gz"
        with gzip.open(p, "wt", compresslevel=1) as f:
            json.dump(doc, f)
        paths.append(p)
    return paths


def _peak_mib() -> float:
    """This process's peak RSS (VmHWM: its own address space's high-water mark; ru_maxrss
    would carry over the parent's peak across fork and exec)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(paths: list[Path], workers: int) -> dict:
    from dask.distributed import Client, LocalCluster

    from proflab.report.job import analyze_job

    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster) as client:
            base = client.run(_peak_mib)
            t0 = time.perf_counter()
            job = analyze_job(paths, scheduler=cluster.scheduler_address, cache=False)
            wall = time.perf_counter() - t0
            peaks = client.run(_peak_mib)
    return {
        "workers": workers,
        "wall_s": wall,
        "per_rank_s": wall * workers / len(paths),
        "peak_mib": sorted(peaks.values()),
        "idle_mib": sorted(base.values()),
        "collectives": job.summary["collectives_matched"],
        "findings": [f.id for f in job.findings],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40, help="steps per rank trace (the source has 5)")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--source", type=Path, default=RUN,
                    help="folder of the real rank traces to scale (default: the 2x H200 DDP run's traces/)")
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="proflab-bench-job-"))
    try:
        paths = make_ranks(tmp, a.ranks, a.steps, a.source)
        size = sum(p.stat().st_size for p in paths) / 2**20
        print(f"{a.ranks} rank traces of {a.steps} steps, {size:.1f} MiB gzip in all ({size / a.ranks:.2f} MiB each)")
        results = [run(paths, w) for w in a.workers]
        print(f"{'workers':>8} {'wall s':>8} {'s/rank/worker':>14} {'peak RSS per worker (MiB)':>28} {'idle':>12}")
        for r in results:
            peaks = ", ".join(f"{x:.0f}" for x in r["peak_mib"])
            idle = ", ".join(f"{x:.0f}" for x in r["idle_mib"])
            print(f"{r['workers']:>8} {r['wall_s']:>8.2f} {r['per_rank_s']:>14.3f} {peaks:>28} {idle:>12}")
        one = results[0]
        print(f"collectives matched: {one['collectives']}; job findings: {one['findings'] or 'none'}")
        if len(results) > 1:
            print(f"speed-up {results[0]['workers']} -> {results[-1]['workers']} workers: {results[0]['wall_s'] / results[-1]['wall_s']:.2f}x")
        per_rank = min(r["per_rank_s"] for r in results)
        print(
            f"projection (arithmetic, not measured): at {per_rank:.3f} s per rank trace of this size per worker, "
            f"1024 ranks on 64 workers take about {1024 * per_rank / 64:.1f} s plus scheduling and the reduction; "
            f"memory per worker stays that of one rank trace at a time (max measured {max(max(r['peak_mib']) for r in results):.0f} MiB)"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
