"""What torch.profiler adds to one eager operator and to its kernel launch, in one process (GPU).

    python benchmarks/probe_launch_cost.py [--out DIR]

A loop of ``x.add_(1)`` on a one-element CUDA tensor (one operator, one ``cudaLaunchKernel``
each), timed on the host in batches of 500 launches (no sync inside a batch; one after it, not
timed), median of 9 batches, in turn:

``bare``        no profiler
``cpu``         torch.profiler, CPU activity only, ``record_shapes=True`` (the operator's callbacks)
``cuda``        CUDA activity only (CUPTI: the launch's runtime record and the kernel's)
``both``        both, as a generation loop is usually recorded
``bare_after``  no profiler again, after the sessions (``TEARDOWN_CUPTI=1``: nothing should stay)

and a loop of ``torch.add`` on 16 CPU floats (an operator that launches nothing) bare and under
``cpu``. Prints one JSON line: microseconds per operator in each mode and the differences
that split the profiler's cost into the operator's callbacks and CUPTI's share of a launch.
With ``--out`` the ``both`` session's trace is written there (``probe_launch.pt.trace.json``).

``--decoder`` times instead an eager decoder written in plain torch (no Hugging Face: RMSNorm,
rotary embedding, grouped-query SDPA, SiLU MLP; 8 layers, 1024 wide, bf16, one token of batch
1), forward by forward (a sync after each), bare, then under torch.profiler (CPU and CUDA,
``record_shapes=True``), then bare again, and writes the profiled forwards' trace
(``probe_decoder.pt.trace.json``). What ``analysis.timeline.event_cost`` reads from that trace
set beside the profiled forward less the bare one says how much of the profiler's cost the
trace's gaps show.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TEARDOWN_CUPTI", "1")
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

BATCH = 500
BATCHES = 9


def per_op_us(fn, sync) -> float:
    times = []
    for _ in range(BATCHES):
        sync()
        t0 = time.perf_counter_ns()
        for _ in range(BATCH):
            fn()
        times.append((time.perf_counter_ns() - t0) / BATCH / 1e3)
        sync()
    return statistics.median(times)


def decoder(out: str | None, forwards: int = 60) -> dict:
    """The plain-torch decoder's forward: bare, profiled, bare again (ms, medians)."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    d, heads, kv, inter, layers = 1024, 16, 4, 2816, 8
    hd = d // heads
    w = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16) * 0.02  # noqa: E731
    blocks = [dict(n1=torch.ones(d, device="cuda", dtype=torch.bfloat16), q=w(d, d), k=w(kv * hd, d), v=w(kv * hd, d),
                   o=w(d, d), n2=torch.ones(d, device="cuda", dtype=torch.bfloat16), g=w(inter, d), u=w(inter, d),
                   dn=w(d, inter)) for _ in range(layers)]
    cos, sin = torch.randn(1, 1, 1, hd, device="cuda", dtype=torch.bfloat16), torch.randn(1, 1, 1, hd, device="cuda", dtype=torch.bfloat16)

    def norm(x, g):
        v = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(v + 1e-6)).to(x.dtype) * g

    def rot(x):
        h = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin

    def forward(x):
        for b in blocks:
            h = norm(x, b["n1"])
            q = F.linear(h, b["q"]).view(1, 1, heads, hd).transpose(1, 2)
            k = F.linear(h, b["k"]).view(1, 1, kv, hd).transpose(1, 2)
            v = F.linear(h, b["v"]).view(1, 1, kv, hd).transpose(1, 2)
            q, k = rot(q), rot(k)
            a = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            x = x + F.linear(a.transpose(1, 2).reshape(1, 1, d), b["o"])
            h = norm(x, b["n2"])
            x = x + F.linear(F.silu(F.linear(h, b["g"])) * F.linear(h, b["u"]), b["dn"])
        return x

    x = torch.randn(1, 1, d, device="cuda", dtype=torch.bfloat16)

    def times(n):
        t = []
        for _ in range(n):
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            forward(x)
            torch.cuda.synchronize()
            t.append((time.perf_counter_ns() - t0) / 1e6)
        return statistics.median(t)

    with torch.inference_mode():
        times(20)
        r = {"bare_ms": times(forwards)}
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            times(5)
            r["profiled_ms"] = times(forwards)
        if out:
            os.makedirs(out, exist_ok=True)
            prof.export_chrome_trace(os.path.join(out, "probe_decoder.pt.trace.json"))
        for _ in range(20):
            torch.cuda.current_device()
        times(10)
        r["bare_after_ms"] = times(forwards)
    r["forwards_in_trace"] = 5 + forwards
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--decoder", action="store_true", help="the plain-torch decoder's forward instead")
    a = ap.parse_args()
    if a.decoder:
        r = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, **decoder(a.out)}
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}))
        return 0
    x = torch.zeros(1, device="cuda")
    c = torch.zeros(16)
    launch, host = (lambda: x.add_(1)), (lambda: torch.add(c, 1))
    sync, nosync = torch.cuda.synchronize, (lambda: None)
    for _ in range(3):
        per_op_us(launch, sync)
    r = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "batch": BATCH}
    r["bare_us"] = per_op_us(launch, sync)
    r["cpu_op_bare_us"] = per_op_us(host, nosync)
    modes = {"cpu": [ProfilerActivity.CPU], "cuda": [ProfilerActivity.CUDA],
             "both": [ProfilerActivity.CPU, ProfilerActivity.CUDA]}
    for name, acts in modes.items():
        with profile(activities=acts, record_shapes=True) as prof:
            per_op_us(launch, sync)  # the session's first launches (CUPTI's start-up)
            r[f"{name}_us"] = per_op_us(launch, sync)
            if name == "cpu":
                r["cpu_op_cpu_us"] = per_op_us(host, nosync)
        if name == "both" and a.out:
            os.makedirs(a.out, exist_ok=True)
            prof.export_chrome_trace(os.path.join(a.out, "probe_launch.pt.trace.json"))
        for _ in range(20):  # CUDA calls after the stop: the teardown completes on one
            torch.cuda.current_device()
            x.add_(0)
        torch.cuda.synchronize()
    r["bare_after_us"] = per_op_us(launch, sync)
    r["callbacks_us"] = round(r["cpu_us"] - r["bare_us"], 3)  # the operator's record, and its launch's
    r["cupti_us"] = round(r["cuda_us"] - r["bare_us"], 3)  # CUPTI alone, per launch
    r["both_less_parts_us"] = round(r["both_us"] - r["cpu_us"] - r["cupti_us"], 3)
    r["cpu_op_callbacks_us"] = round(r["cpu_op_cpu_us"] - r["cpu_op_bare_us"], 3)
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
