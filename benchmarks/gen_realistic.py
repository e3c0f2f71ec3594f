"""Generate a realistic-shape Kineto (torch.profiler) trace of any size from a real one.

``gen_kineto.py`` repeats the source's steps as they are. This generator rebuilds the shape
that breaks trace tools on real training runs, out of the source's own events (so every
field, key order and id layout is Kineto's):

* **one hot host thread**: forward, backward and optimizer all run on the main thread
  (``--backward-thread autograd`` keeps backward on the source's autograd thread);
* **a deep model**: the source's forward, backward and optimizer operators are replayed
  ``--depth`` times per step (each forward pass wrapped in a ``layers.N`` annotation), with
  their whole ``cpu_op`` nesting and their runtime/driver calls;
* **long ranges**: ``## forward ##``, ``## backward ##`` and the ``Optimizer.step#...``
  annotations (host ``user_annotation``) each span thousands of kernels and GPU gaps;
  ``ProfilerStep#N`` spans on the host and as ``gpu_user_annotation`` on the compute stream;
* **launches**: every kernel, memcpy and memset has its runtime call (same ``correlation``
  and ``External id``) and an ``ac2g`` flow pair (``s`` at the call, ``f`` at the activity);
  kernels start a few microseconds after their launch or when the stream frees up, so short
  kernels leave launch gaps and long ones queue work (100k+ gaps at a few hundred MB);
* **NCCL on a second stream**: every ``--bucket`` backward operators an all-reduce
  (``record_param_comms`` > ``nccl:all_reduce`` > ``cudaLaunchKernel`` >
  ``ncclDevKernel_AllReduce_Sum_bf16_RING_LL`` on stream 20), overlapping compute;
* **a sync per step**: the step ends in ``aten::item`` (a blocking DtoH copy into pageable
  memory), as a logged loss does;
* ``fwdbwd`` flows of the replayed operators are kept. Python frames (``with_stack``) are
  left out (the header says ``with_stack: 0``): their parent ids do not survive reordering.

Ids (``External id``, ``correlation``, ``Sequence number``, ``Record function id``, flow
ids) are renumbered per replayed operator, so they stay unique. The output is written in
Kineto's text layout one event at a time (memory stays small for any size); a name ending
in ``.gz`` is gzip-compressed.

Usage::

    python benchmarks/gen_realistic.py OUT.json --size-mb 500
    python benchmarks/gen_realistic.py OUT.json --steps 20 --depth 8 --source SRC.json.gz
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

Event = dict[str, Any]
DEFAULT_DIST_INFO = {"backend": "nccl", "rank": 0, "world_size": 1}
_dumps = msgspec.json.encode
_KEYS: dict[str, bytes] = {}


def read_trace(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    elif raw[:6] == b"\xfd7zXZ\x00":
        import lzma

        raw = lzma.decompress(raw)
    return msgspec.json.decode(raw)


def render(ev: Event) -> bytes:
    """One event in Kineto's text layout: a key per line, ``args`` on one line."""
    parts = []
    for k, v in ev.items():
        kb = _KEYS.get(k)
        if kb is None:
            kb = _KEYS[k] = b'    "' + k.encode() + b'": '
        if k == "args" and type(v) is dict:
            parts.append(kb + b"{\n      " + _dumps(v)[1:-1].replace(b',"', b', "').replace(b'":', b'": ') + b"\n    }")
        else:
            parts.append(kb + _dumps(v))
    return b"  {\n" + b",\n".join(parts) + b"\n  }"


def header_bytes(top: dict[str, Any]) -> tuple[bytes, bytes]:
    """Top-level keys before and after ``traceEvents`` (Kineto's order)."""
    keys = list(top)
    i = keys.index("traceEvents")
    dump = lambda k: f'  "{k}": ' + json.dumps(top[k], indent=2).replace("\n", "\n  ")  # noqa: E731
    head = "{\n" + "".join(dump(k) + ",\n" for k in keys[:i]) + '  "traceEvents": [\n'
    tail = "\n  ]" + "".join(",\n" + dump(k) for k in keys[i + 1 :]) + "\n}\n"
    return head.encode(), tail.encode()

DEFAULT_SOURCE = Path(__file__).resolve().parent.parent / "tests" / "data" / "kineto" / "train_loop.pt.trace.json.gz"
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
HOST_CATS = frozenset({"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"})
SYNC_CALLS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"})
NCCL_STREAM = 20
NCCL_KERNEL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
# args keys renumbered per replayed operator, each family with its own counter
ID_KEYS = {"External id": "ext", "correlation": "corr", "Sequence number": "seq", "Record function id": "rf"}


@dataclass
class Unit:
    """A top-level host operator (or annotation) with everything under it: nested ops,
    runtime/driver calls, the GPU activities they launched, fwdbwd flow events."""

    top: Event
    host: list[Event]  # top first, then descendants, by ts
    gpu: list[Event]  # activities launched from inside, by ts
    flows: list[Event]  # fwdbwd flow events on the thread inside the span
    children: list[Unit] = field(default_factory=list)  # for annotations: their own top-level ops
    lo: dict[str, int] = field(default_factory=dict)  # id family -> smallest id inside
    span: dict[str, int] = field(default_factory=dict)  # id family -> ids used

    @property
    def ts(self) -> float:
        return self.top["ts"]

    @property
    def dur(self) -> float:
        return self.top["dur"]


@dataclass
class Source:
    top: dict[str, Any]  # top-level keys (traceEvents emptied)
    meta: list[Event]
    main_tid: int
    pid: int
    autograd_tid: int | None
    compute_stream: int
    device: int
    data: list[Unit]
    forward: list[Unit]
    backward: list[Unit]
    optimizer: list[Unit]
    annotation: Event  # a user_annotation to copy
    gpu_annotation: Event  # a gpu_user_annotation to copy
    kernel: Event  # a kernel to copy (for NCCL)
    runtime: Event  # a cudaLaunchKernel to copy
    op: Event  # a cpu_op to copy
    memcpy: Event | None


def _ids(units: list[Unit]) -> None:
    for u in units:
        seen: dict[str, list[int]] = {}
        for e in (*u.host, *u.gpu):
            for key, fam in ID_KEYS.items():
                v = e.get("args", {}).get(key)
                if isinstance(v, int) and v > 0:
                    seen.setdefault(fam, []).append(v)
        for e in u.flows:
            seen.setdefault("flow", []).append(e["id"])
        u.lo = {f: min(v) for f, v in seen.items()}
        u.span = {f: max(v) - min(v) + 1 for f, v in seen.items()}
        _ids(u.children)


def _units(events: list[Event], lo: float, hi: float, gpu_by_corr: dict[int, Event], flows: list[Event]) -> list[Unit]:
    """Top-level units among host events of one thread (sorted by ts, longest first) in [lo, hi)."""
    out: list[Unit] = []
    starts = [e["ts"] for e in events]
    i = bisect.bisect_left(starts, lo)
    flow_ts = [f["ts"] for f in flows]
    while i < len(events) and events[i]["ts"] < hi:
        top = events[i]
        end = top["ts"] + top.get("dur", 0)
        j = bisect.bisect_left(starts, end, lo=i + 1)
        # events starting exactly at the end belong to the next unit unless nested (dur 0)
        host = events[i:j]
        gpu = sorted(
            (gpu_by_corr[c] for c in (e.get("args", {}).get("correlation") for e in host) if c in gpu_by_corr),
            key=lambda g: g["ts"],
        )
        fl = flows[bisect.bisect_left(flow_ts, top["ts"]) : bisect.bisect_left(flow_ts, end)]
        u = Unit(top, host, gpu, fl)
        if top["cat"] == "user_annotation":
            u.children = _units(events[i + 1 : j], top["ts"], end, gpu_by_corr, fl)
        out.append(u)
        i = max(j, i + 1)
    return out


def load_source(path: Path) -> Source:
    trace = read_trace(path)
    events = trace["traceEvents"]
    top: dict[str, Any] = {}
    for k, v in trace.items():  # Kineto's key order; distributedInfo after deviceProperties
        if k == "traceEvents" and "distributedInfo" not in top and "distributedInfo" not in trace:
            top["distributedInfo"] = dict(DEFAULT_DIST_INFO)
        top[k] = [] if k == "traceEvents" else v
        if k == "deviceProperties" and "distributedInfo" not in trace:
            top["distributedInfo"] = dict(DEFAULT_DIST_INFO)
    top["with_stack"] = 0
    meta = [e for e in events if e.get("ph") == "M"]
    steps = sorted(
        (e for e in events if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#")),
        key=lambda e: e["ts"],
    )
    if not steps:
        raise SystemExit(f"{path}: no ProfilerStep#N annotations to take a step from")
    step = steps[0]
    pid, main_tid = step["pid"], step["tid"]
    s0, s1 = step["ts"], step["ts"] + step["dur"]
    gpu_by_corr = {e["args"]["correlation"]: e for e in events if e.get("cat") in GPU_CATS and e.get("ph") == "X"}
    kernels = [e for e in events if e.get("cat") == "kernel"]
    compute_stream = max({k["args"]["stream"] for k in kernels}, key=lambda s: sum(k["args"]["stream"] == s for k in kernels))
    device = kernels[0]["args"]["device"]

    def host_of(tid: int) -> list[Event]:
        got = [
            e
            for e in events
            if e.get("ph") == "X" and e.get("cat") in HOST_CATS and e.get("tid") == tid and e.get("pid") == pid
            and not str(e.get("name", "")).startswith("ProfilerStep#")
        ]
        return sorted(got, key=lambda e: (e["ts"], -e.get("dur", 0)))

    def flows_of(tid: int) -> list[Event]:
        return sorted((e for e in events if e.get("cat") == "fwdbwd" and e.get("tid") == tid), key=lambda e: e["ts"])

    main = _units(host_of(main_tid), s0, s1, gpu_by_corr, flows_of(main_tid))
    # the autograd thread: the other host thread with the most launches inside the step
    launches: dict[int, int] = {}
    for e in events:
        if e.get("cat") == "cuda_runtime" and e.get("tid") != main_tid and s0 <= e["ts"] < s1:
            launches[e["tid"]] = launches.get(e["tid"], 0) + 1
    autograd_tid = max(launches, key=launches.get) if launches else None
    backward = _units(host_of(autograd_tid), s0, s1, gpu_by_corr, flows_of(autograd_tid)) if autograd_tid else []
    # never replay a unit that blocks on the GPU: its time would be wrong once moved
    ok = lambda u: not any(e["name"] in SYNC_CALLS for e in u.host)  # noqa: E731
    b0 = backward[0].ts if backward else s1
    b1 = backward[-1].ts + backward[-1].dur if backward else s1
    first_compute = next((i for i, u in enumerate(main) if u.gpu and u.top["name"] not in ("aten::to", "aten::copy_")
                          and u.top["cat"] == "cpu_op"), 0)
    data = [u for u in main[:first_compute] if ok(u)]
    forward = [u for u in main[first_compute:] if u.ts < b0 and ok(u)]
    optimizer = [u for u in main if u.ts >= b1 and ok(u)]
    backward = [u for u in backward if ok(u)]
    _ids(data + forward + backward + optimizer)
    ann = next(e for e in events if e.get("cat") == "user_annotation")
    gann = next(e for e in events if e.get("cat") == "gpu_user_annotation")
    runtime = next(e for e in events if e.get("cat") == "cuda_runtime" and e["name"] == "cudaLaunchKernel")
    op = next(e for e in events if e.get("cat") == "cpu_op" and "Sequence number" not in e.get("args", {}))
    memcpy = next((e for e in events if e.get("cat") == "gpu_memcpy"), None)
    return Source(top, meta, main_tid, pid, autograd_tid, compute_stream, device, data, forward, backward, optimizer,
                  ann, gann, kernels[0], runtime, op, memcpy)


class Writer:
    """Streams events in Kineto's layout and keeps the clocks and id counters."""

    def __init__(self, f: BinaryIO, src: Source, t0: float, backward_tid: int, gpu_scale: float) -> None:
        self.f, self.src = f, src
        self.gpu_scale = gpu_scale
        self.sep = b""
        self.bytes = 0
        self.events = 0
        self.host_ts = t0  # the hot thread's clock
        self.stream_free: dict[int, float] = {}
        self.next_id = {"ext": 1, "corr": 1, "seq": 1, "rf": 1, "flow": 1}
        self.backward_tid = backward_tid
        self.kernels = 0

    def emit(self, ev: Event) -> None:
        chunk = self.sep + render(ev)
        self.f.write(chunk)
        self.bytes += len(chunk)
        self.events += 1
        self.sep = b",\n"

    def take(self, fam: str, n: int = 1) -> int:
        v = self.next_id[fam]
        self.next_id[fam] = v + n
        return v

    def annotation(self, name: str, ts: float, dur: float, tid: int | None = None) -> None:
        e = dict(self.src.annotation)
        e.update(name=name, tid=self.src.main_tid if tid is None else tid, ts=round(ts, 3), dur=round(dur, 3))
        e["args"] = {**e["args"], "External id": self.take("ext"), "Record function id": 0}
        self.emit(e)

    def launch_gpu(self, g: Event, corr: int, ext: int, call: Event, start: float | None = None, scale: bool = True) -> float:
        """Place one activity launched by ``call``: a few us after it, or when its stream frees."""
        stream = g["args"]["stream"]
        if start is None:
            latency = 3.0 + (corr % 7) * 0.5
            start = max(self.stream_free.get(stream, 0.0), call["ts"] + min(call.get("dur", 0.0), 8.0) + latency)
        e = dict(g)
        e["ts"] = round(start, 3)
        if scale and g.get("cat") == "kernel":
            # the source's kernels are long for its host code: shorten them, unevenly
            # (0.25x to 1.75x the scale by correlation), so that busy stretches and launch
            # gaps alternate as in a real run
            e["dur"] = round(max(g["dur"] * self.gpu_scale * (0.25 + (corr * 7919 % 13) / 8.0), 0.9), 3)
        e["args"] = {**g["args"], "correlation": corr, "External id": ext}
        self.stream_free[stream] = start + e["dur"]
        self.emit(e)
        self.emit({"ph": "s", "id": corr, "pid": call["pid"], "tid": call["tid"], "ts": call["ts"], "cat": "ac2g", "name": "ac2g"})
        self.emit({"ph": "f", "id": corr, "pid": e["pid"], "tid": e["tid"], "ts": e["ts"], "cat": "ac2g", "name": "ac2g", "bp": "e"})
        if g.get("cat") == "kernel":
            self.kernels += 1
        return start + e["dur"]

    def replay(self, u: Unit, tid: int, gap_us: float = 2.0) -> None:
        """Copy a unit to the hot thread's clock, ids renumbered; annotations replay their children."""
        shift = self.host_ts - u.ts
        base = {fam: self.take(fam, n) - u.lo[fam] for fam, n in u.span.items()}
        if u.children:
            start = self.host_ts
            # children keep their source spacing relative to the annotation's start
            for c in u.children:
                self.host_ts = max(self.host_ts, c.ts + shift)
                self.replay(c, tid, 0.0)
            end = max(self.host_ts, u.ts + u.dur + shift)
            top = dict(u.top)
            top.update(tid=tid, ts=round(start, 3), dur=round(end - start, 3))
            top["args"] = self._renumbered(u.top.get("args", {}), base)
            self.emit(top)
            self.host_ts = end + gap_us
            return
        corr_new: dict[int, tuple[int, int, Event]] = {}
        for e in u.host:
            c = dict(e)
            c["tid"] = tid
            c["ts"] = round(e["ts"] + shift, 3)
            if "args" in e:
                c["args"] = self._renumbered(e["args"], base)
                corr = e["args"].get("correlation")
                if corr is not None:
                    corr_new[corr] = (c["args"]["correlation"], c["args"].get("External id", 0), c)
            self.emit(c)
        for g in u.gpu:
            new_corr, ext, call = corr_new[g["args"]["correlation"]]
            self.launch_gpu(g, new_corr, ext, call)
        for fl in u.flows:
            c = dict(fl)
            c.update(tid=tid, ts=round(fl["ts"] + shift, 3), id=fl["id"] - u.lo["flow"] + base["flow"])
            self.emit(c)
        self.host_ts += u.dur + gap_us

    @staticmethod
    def _renumbered(args: dict[str, Any], base: dict[str, int]) -> dict[str, Any]:
        out = dict(args)
        for key, fam in ID_KEYS.items():
            v = out.get(key)
            if isinstance(v, int) and v > 0 and fam in base:
                out[key] = v + base[fam]
        return out

    def nccl(self, tid: int, bytes_: int) -> None:
        """An all-reduce bucket: ops on the hot thread, the kernel on the NCCL stream."""
        s = self.src
        t = self.host_ts
        ext, corr = self.take("ext"), self.take("corr")
        outer = dict(s.op)
        outer.update(name="record_param_comms", tid=tid, ts=round(t, 3), dur=24.0)
        outer["args"] = {"External id": ext, "Record function id": 0, "Ev Idx": 0}
        inner = dict(s.op)
        inner.update(name="nccl:all_reduce", tid=tid, ts=round(t + 2.1, 3), dur=19.5)
        inner["args"] = {"External id": ext + 0, "Record function id": 0, "Ev Idx": 0}
        call = dict(s.runtime)
        call.update(tid=tid, ts=round(t + 6.4, 3), dur=9.8)
        call["args"] = {"External id": ext, "cbid": 211, "correlation": corr}
        for e in (outer, inner, call):
            self.emit(e)
        k = dict(s.kernel)
        k.update(name=NCCL_KERNEL, tid=NCCL_STREAM, dur=round(40.0 + bytes_ / 25e3, 3))
        k["args"] = {**s.kernel["args"], "stream": NCCL_STREAM, "grid": [16, 1, 1], "block": [640, 1, 1],
                     "registers per thread": 96, "shared memory": 0}
        self.launch_gpu(k, corr, ext, call, scale=False)
        self.host_ts = t + 26.0

    def item(self, tid: int) -> None:
        """``loss.item()``: a blocking DtoH copy that waits for the compute stream."""
        s = self.src
        t = self.host_ts
        ext, corr = self.take("ext"), self.take("corr")
        free = self.stream_free.get(s.compute_stream, t)
        copy_start = max(free, t + 12.0)
        copy_dur = 1.6
        end = copy_start + copy_dur + 4.0
        for name, ts, dur in (("aten::item", t, end + 3.0 - t), ("aten::_local_scalar_dense", t + 1.5, end + 1.0 - t - 1.5)):
            e = dict(s.op)
            e.update(name=name, tid=tid, ts=round(ts, 3), dur=round(dur, 3))
            e["args"] = {"External id": ext, "Record function id": 0, "Ev Idx": 0}
            self.emit(e)
        call = dict(s.runtime)
        call.update(name="cudaMemcpyAsync", tid=tid, ts=round(t + 5.0, 3), dur=round(end - t - 5.0, 3))
        call["args"] = {"External id": ext, "cbid": 51, "correlation": corr}
        self.emit(call)
        if s.memcpy is not None:
            m = dict(s.memcpy)
            m.update(name="Memcpy DtoH (Device -> Pageable)", tid=s.compute_stream, dur=copy_dur)
            m["args"] = {**s.memcpy["args"], "stream": s.compute_stream, "bytes": 4}
            self.launch_gpu(m, corr, ext, call, copy_start, scale=False)
        self.host_ts = end + 3.0 + 5.0


def write_step(w: Writer, step_no: int, depth: int, bucket: int) -> None:
    s = w.src
    tid = s.main_tid
    step_start = w.host_ts
    gpu_from = max(w.stream_free.get(s.compute_stream, step_start), step_start)
    w.host_ts += 3.0
    for u in s.data:
        w.replay(u, tid)
    f0 = w.host_ts
    w.host_ts += 1.0
    for layer in range(depth):
        l0 = w.host_ts
        w.host_ts += 0.8
        for u in s.forward:
            w.replay(u, tid)
        w.annotation(f"layers.{layer}", l0, w.host_ts - l0)
        w.host_ts += 1.0
    w.annotation("## forward ##", f0, w.host_ts - f0)
    b0 = w.host_ts
    w.host_ts += 1.0
    btid = w.backward_tid
    n = 0
    for _ in range(depth):
        for u in s.backward:
            w.replay(u, btid)
            n += 1
            if bucket and n % bucket == 0:
                w.nccl(btid, 25 << 20)
    if bucket:
        w.nccl(btid, 25 << 20)
    w.annotation("## backward ##", b0, w.host_ts - b0)
    o0 = w.host_ts
    w.host_ts += 1.0
    for _ in range(depth):
        for u in s.optimizer:
            w.replay(u, tid)
    w.annotation("## optimizer ##", o0, w.host_ts - o0)
    w.item(tid)
    w.annotation(f"ProfilerStep#{step_no}", step_start, w.host_ts - step_start)
    gpu_end = w.stream_free.get(s.compute_stream, w.host_ts)
    g = dict(s.gpu_annotation)
    g.update(name=f"ProfilerStep#{step_no}", tid=s.compute_stream, ts=round(gpu_from, 3), dur=round(gpu_end - gpu_from, 3))
    g["args"] = {"External id": w.take("ext")}
    w.emit(g)
    w.host_ts += 20.0


def generate(out: Path, size_mb: float | None = None, steps: int | None = None, depth: int = 8, bucket: int = 60,
             source: Path = DEFAULT_SOURCE, backward_thread: str = "main", gpu_scale: float = 0.1) -> dict[str, Any]:
    src = load_source(source)
    t0 = min(u.ts for u in src.data + src.forward) if (src.data or src.forward) else 0.0
    btid = src.main_tid if backward_thread == "main" or src.autograd_tid is None else src.autograd_tid
    head, tail = header_bytes(src.top)
    opener = gzip.open if out.suffix == ".gz" else open
    target = None if size_mb is None else size_mb * 1e6 - len(head) - len(tail)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    n = 0
    with opener(tmp, "wb") as f:  # type: ignore[operator]
        f.write(head)
        w = Writer(f, src, t0, btid, gpu_scale)
        for e in src.meta:
            w.emit(e)
        while (steps is not None and n < steps) or (steps is None and w.bytes < (target or 0)):
            write_step(w, n + 1, depth, bucket)
            n += 1
        f.write(tail)
    tmp.replace(out)
    return {"output": str(out), "source": str(source), "steps": n, "depth": depth, "events": w.events,
            "kernels": w.kernels, "bytes": w.bytes + len(head) + len(tail)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="output trace (.json, or .json.gz to compress)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--size-mb", type=float, help="approximate uncompressed size in 10^6 bytes (whole steps)")
    g.add_argument("--steps", type=int, help="number of profiler steps")
    p.add_argument("--depth", type=int, default=8, help="model passes per step (default 8)")
    p.add_argument("--bucket", type=int, default=60, help="backward operators per NCCL all-reduce (0: none)")
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="the real trace to build from")
    p.add_argument("--backward-thread", choices=("main", "autograd"), default="main")
    p.add_argument("--gpu-scale", type=float, default=0.1,
                   help="kernel durations times this (default 0.1: the source's H100 kernels against its host code "
                        "leave the GPU 99%% busy; 0.1 gives a mix of busy stretches and launch/host gaps)")
    a = p.parse_args(argv)
    info = generate(a.out, a.size_mb, a.steps, a.depth, a.bucket, a.source, a.backward_thread, a.gpu_scale)
    print(" ".join(f"{k}={v}" for k, v in info.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
