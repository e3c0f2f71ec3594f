"""The communication split on real NCCL kernels (tests/data/kineto/ddp: two-GPU DDP, one trace
per rank). Communication in the breakdown is the exposed part: NCCL time with no compute
kernel running alongside."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import proflab

DDP = Path(__file__).parent / "data" / "kineto" / "ddp"
RANKS = [DDP / f"ddp_rank{r}.pt.trace.json.gz" for r in (0, 1)]


def _union(spans):
    total, cur = 0, None
    for s, e in sorted(spans):
        if cur is None or s > cur[1]:
            if cur:
                total += cur[1] - cur[0]
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    return total + (cur[1] - cur[0] if cur else 0)


@pytest.mark.parametrize("path", RANKS, ids=lambda p: p.name)
def test_exposed_communication_matches_plain_python(path):
    report = proflab.analyze(path)
    (dev,) = report.summary["devices"]
    with gzip.open(path, "rt") as fh:
        events = [e for e in json.load(fh)["traceEvents"] if e.get("cat") == "kernel"]
    lo, hi = report.summary["window_start_ns"], report.summary["window_end_ns"]

    def spans(pred):
        out = []
        for e in events:
            s = round(e["ts"] * 1000)
            s, t = max(s, lo), min(s + round(e["dur"] * 1000), hi)
            if t > s and pred(e["name"]):
                out.append((s, t))
        return out

    nccl = spans(lambda n: "nccl" in n.lower())
    compute = spans(lambda n: "nccl" not in n.lower())
    assert nccl, "the DDP trace has NCCL kernels"
    exposed_ms = (_union(nccl + compute) - _union(compute)) / 1e6
    assert dev["breakdown_ms"]["communication"] == pytest.approx(exposed_ms, abs=0.002)
    assert 0 < dev["breakdown_ms"]["communication"] < sum(t - s for s, t in nccl) / 1e6 + 0.002
    assert sum(dev["breakdown_ms"].values()) == pytest.approx(report.summary["wall_ms"], abs=0.005)


@pytest.mark.parametrize("rank", [0, 1])
def test_rank_and_nccl_kernels_are_reported(rank):
    report = proflab.analyze(RANKS[rank])
    assert report.source["distributed"]["rank"] == rank
    assert report.source["distributed"]["world_size"] == 2
    comm = [k for k in report.kernels if k["is_comm"]]
    assert comm and all("nccl" in k["name"].lower() for k in comm)
    assert not any("nccl" in k["name"].lower() for k in report.kernels if not k["is_comm"])
