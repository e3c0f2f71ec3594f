"""Scale a real recorded Kineto (PyTorch profiler) trace up to a large, realistic one.

The source trace is split into its ``ProfilerStep#N`` windows.  Every event of
every category belongs to one step (host-side events by timestamp, device-side
events through the ``correlation`` of the runtime call that launched them, GPU
user annotations through their ``External id``); events before the first step
form the prologue, events after the last step the epilogue.  The output keeps
the prologue, then lays the steps out one after another in time, cycling
through the source steps, and ends with the epilogue:

* ``ts`` is shifted so that each copy starts where the previous one ended
  (source spacing is kept; the first pass over the steps is the source itself);
* ids that must stay unique and consistent (``External id``, ``correlation``,
  flow ``id``, ``Python id``/``Python parent id``, ``Record function id``,
  ``Sequence number``, ``Ev Idx``) are offset by ``cycle * (max id + 1)`` per
  id family, except ids owned by prologue/epilogue events (for example the
  ``Python id`` of the enclosing ``<module>`` frame), which are kept;
* ``ProfilerStep#N`` names are renumbered consecutively;
* prologue events that enclose the steps (top-level Python frames, the
  profiler span) are stretched to cover the longer timeline.

Metadata events (ph ``M``), ``deviceProperties``, ``distributedInfo`` and the
other top-level keys are kept; ``distributedInfo`` is added when missing
(HTA needs a rank).  Events are written incrementally in Kineto's own layout
(one key per line, ``args`` on one line), so a 500 MB output needs little
memory.  An output name ending in ``.gz`` is gzip-compressed.

Usage::

    python benchmarks/gen_kineto.py SRC OUT --size-mb 500
    python benchmarks/gen_kineto.py SRC OUT --steps 2000
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson

Event = dict[str, Any]

STEP_RE = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")
FLOW_PHASES = frozenset({"s", "t", "f"})
DEFAULT_DIST_INFO = {"backend": "nccl", "rank": 0, "world_size": 1}

# args key -> id family.  Ids of one family share one offset per cycle.
ARG_ID_FAMILY = {
    "External id": "external",
    "correlation": "correlation",
    "wait_on_cuda_event_record_corr_id": "correlation",
    "Python id": "python",
    "Python parent id": "python",
    "Record function id": "record_function",
    "Sequence number": "sequence",
    "Ev Idx": "ev_idx",
}


# keys that refer to an id owned by another event
REFERENCE_KEYS = frozenset({"Python parent id"})


def flow_family(ev: Event) -> str:
    """Id family of a flow event's ``id`` (ac2g flow ids are correlation ids)."""
    cat = ev.get("cat", "")
    return "correlation" if cat == "ac2g" else f"flow:{cat}"


def is_id(value: Any) -> bool:
    """True for a renumberable id (0 and null mean 'none' in Kineto)."""
    return type(value) is int and value > 0


def read_trace(path: Path) -> dict[str, Any]:
    """Load a ``.json``, ``.json.gz`` or ``.json.xz`` trace."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    elif raw[:6] == b"\xfd7zXZ\x00":
        import lzma

        raw = lzma.decompress(raw)
    return orjson.loads(raw)


# --------------------------------------------------------------------------- layout


@dataclass
class Template:
    """A source event plus what must change when it is copied."""

    ev: Event
    patches: list[tuple[bool, str, int, str]]  # (in args?, key, original, family)
    step_name: bool  # name is ProfilerStep#N


@dataclass
class Layout:
    """The source trace split into prologue, steps and epilogue."""

    meta: list[Event]
    prologue: list[Event]
    steps: list[list[Template]]
    epilogue: list[Event]
    step_ts: list[float]  # start of each source step
    periods: list[float]  # time from one step's start to the next
    first_step_no: int
    cpu_end: float  # end of the last source step on the host
    spans: dict[str, int] = field(default_factory=dict)  # id family -> max id + 1


def event_ids(ev: Event) -> Iterator[tuple[bool, str, int, str]]:
    """(in args?, key, value, family) for each renumberable id of an event."""
    if ev.get("ph") in FLOW_PHASES and is_id(ev.get("id")):
        yield False, "id", ev["id"], flow_family(ev)
    args = ev.get("args")
    if args:
        for key, fam in ARG_ID_FAMILY.items():
            val = args.get(key)
            if is_id(val):
                yield True, key, val, fam


def adopt_python_children(buckets: list[list[Event]], epilogue: list[Event]) -> list[Event]:
    """Move epilogue Python frames whose parent frame is in a step into that step.

    The last step's trailing frames (e.g. ``prof.step()`` returning) start
    after its annotation ends; they must be copied with it.
    """
    owner = {
        e["args"]["Python id"]: k
        for k, bucket in enumerate(buckets)
        for e in bucket
        if is_id((e.get("args") or {}).get("Python id"))
    }
    rest: list[Event] = []
    for e in sorted(epilogue, key=lambda e: e["ts"]):
        args = e.get("args") or {}
        k = owner.get(args.get("Python parent id"))
        if k is None:
            rest.append(e)
            continue
        buckets[k].append(e)
        if is_id(args.get("Python id")):
            owner[args["Python id"]] = k
    rest_ids = {id(e) for e in rest}
    return [e for e in epilogue if id(e) in rest_ids]


def find_steps(events: list[Event]) -> list[Event]:
    """Host-side ProfilerStep#N annotations, sorted by time."""
    steps = [
        e
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") in ("user_annotation", "cpu_op", None)
        and STEP_RE.match(str(e.get("name", "")))
    ]
    steps.sort(key=lambda e: e["ts"])
    if not steps:
        sys.exit("source trace has no ProfilerStep#N annotations; record it with a profiler schedule")
    return steps


def build_layout(events: list[Event]) -> Layout:
    """Assign every event to the prologue, a step or the epilogue."""
    steps = find_steps(events)
    starts = [float(s["ts"]) for s in steps]
    n = len(steps)
    cpu_end = float(steps[-1]["ts"]) + float(steps[-1]["dur"])
    first_ts = starts[0]

    def step_by_ts(ts: float) -> int:
        """-1 before the first step, n after the last one."""
        if ts < first_ts:
            return -1
        if ts >= cpu_end:
            return n
        return bisect.bisect_right(starts, ts) - 1

    # host step of each correlation / External id: the earliest event carrying it
    corr_first: dict[int, float] = {}
    ext_first: dict[int, float] = {}
    for e in events:
        if "ts" not in e or e.get("ph") == "M":
            continue
        args = e.get("args") or {}
        ts = float(e["ts"])
        c = args.get("correlation")
        if is_id(c) and ts < corr_first.get(c, float("inf")):
            corr_first[c] = ts
        x = args.get("External id")
        if is_id(x) and not str(e.get("cat", "")).startswith("gpu_") and ts < ext_first.get(x, float("inf")):
            ext_first[x] = ts

    def step_of(e: Event) -> int:
        args = e.get("args") or {}
        ts = float(e["ts"])
        corr = args.get("correlation")
        if e.get("ph") in FLOW_PHASES and e.get("cat") == "ac2g":
            corr = e.get("id")
        if is_id(corr) and corr in corr_first:
            return step_by_ts(corr_first[corr])
        ext = args.get("External id")
        if str(e.get("cat", "")).startswith("gpu_") and is_id(ext) and ext in ext_first:
            return step_by_ts(ext_first[ext])
        return step_by_ts(ts)

    meta: list[Event] = []
    prologue: list[Event] = []
    epilogue: list[Event] = []
    buckets: list[list[Event]] = [[] for _ in range(n)]
    for e in events:
        if e.get("ph") == "M" or "ts" not in e:
            meta.append(e)
            continue
        k = step_of(e)
        (prologue if k < 0 else epilogue if k >= n else buckets[k]).append(e)

    epilogue = adopt_python_children(buckets, epilogue)

    spans: dict[str, int] = {}
    fixed: dict[str, set[int]] = {}  # ids owned by events outside the steps
    for e in events:
        for _, _, val, fam in event_ids(e):
            spans[fam] = max(spans.get(fam, 0), val + 1)
    for e in prologue + epilogue + meta:
        for _, key, val, fam in event_ids(e):
            if key not in REFERENCE_KEYS:
                fixed.setdefault(fam, set()).add(val)

    templates = [
        [
            Template(
                ev=e,
                patches=[p for p in event_ids(e) if p[2] not in fixed.get(p[3], ())],
                step_name=bool(STEP_RE.match(str(e.get("name", "")))),
            )
            for e in bucket
        ]
        for bucket in buckets
    ]

    # spacing: keep the source gaps; after the last step leave room for its
    # device-side tail plus the average host gap between steps
    periods = [starts[i + 1] - starts[i] for i in range(n - 1)]
    gaps = [starts[i + 1] - (starts[i] + float(steps[i]["dur"])) for i in range(n - 1)]
    gap = max(sum(gaps) / len(gaps), 0.0) if gaps else 10.0
    last_end = max(float(e["ts"]) + float(e.get("dur", 0) or 0) for e in buckets[-1])
    periods.append(max(last_end, cpu_end) - starts[-1] + gap)

    m = STEP_RE.match(steps[0]["name"])
    assert m
    return Layout(meta, prologue, templates, epilogue, starts, periods, int(m.group(1)), cpu_end, spans)


# --------------------------------------------------------------------------- output


_KEYS: dict[str, bytes] = {}


def render(ev: Event) -> bytes:
    """One event in Kineto's layout: a key per line, ``args`` on one line."""
    parts = []
    for k, v in ev.items():
        kb = _KEYS.get(k)
        if kb is None:
            kb = _KEYS[k] = b'    "' + k.encode() + b'": '
        if k == "args" and type(v) is dict:
            parts.append(kb + b"{\n      " + orjson.dumps(v)[1:-1] + b"\n    }")
        else:
            parts.append(kb + orjson.dumps(v))
    return b"  {\n" + b",\n".join(parts) + b"\n  }"


def copy_event(t: Template, shift: float, offsets: dict[str, int], step_no: int) -> Event:
    """A shifted, renumbered copy of a template event."""
    src = t.ev
    ev = dict(src)
    ev["ts"] = round(src["ts"] + shift, 3)
    if t.patches:
        args = ev["args"] = dict(src["args"]) if "args" in src else {}
        for in_args, key, val, fam in t.patches:
            (args if in_args else ev)[key] = val + offsets[fam]
    if t.step_name:
        ev["name"] = f"ProfilerStep#{step_no}"
    return ev


def stretch(ev: Event, layout: Layout, extra: float) -> Event:
    """Prologue events that enclose all steps grow with the timeline."""
    dur = ev.get("dur")
    if extra and isinstance(dur, (int, float)) and ev["ts"] + dur >= layout.cpu_end:
        ev = dict(ev)
        ev["dur"] = round(dur + extra, 3)
    return ev


def shifted(ev: Event, extra: float) -> Event:
    ev = dict(ev)
    ev["ts"] = round(ev["ts"] + extra, 3)
    return ev


def step_bytes(layout: Layout) -> list[int]:
    """Rendered size of each source step (for --size-mb)."""
    return [sum(len(render(t.ev)) + 2 for t in step) for step in layout.steps]


def header_bytes(top: dict[str, Any]) -> tuple[bytes, bytes]:
    """Top-level keys before and after ``traceEvents`` (Kineto order)."""
    keys = list(top)
    i = keys.index("traceEvents")
    dump = lambda k: f'  "{k}": ' + json.dumps(top[k], indent=2).replace("\n", "\n  ")
    head = "{\n" + "".join(dump(k) + ",\n" for k in keys[:i]) + '  "traceEvents": [\n'
    tail = "\n  ]" + "".join(",\n" + dump(k) for k in keys[i + 1 :]) + "\n}\n"
    return head.encode(), tail.encode()


def top_level(trace: dict[str, Any]) -> dict[str, Any]:
    """Top-level keys with ``distributedInfo`` guaranteed (after deviceProperties)."""
    if "distributedInfo" in trace:
        return trace
    out: dict[str, Any] = {}
    for k, v in trace.items():
        if k == "traceEvents" and "distributedInfo" not in out:
            out["distributedInfo"] = dict(DEFAULT_DIST_INFO)
        out[k] = v
        if k == "deviceProperties":
            out["distributedInfo"] = dict(DEFAULT_DIST_INFO)
    return out


def plan_steps(layout: Layout, size_mb: float | None, steps: int | None) -> int:
    """Number of output steps for a target size or an explicit count."""
    if steps is not None:
        return max(1, steps)
    assert size_mb is not None
    sizes = step_bytes(layout)
    fixed = sum(len(render(e)) + 2 for e in layout.meta + layout.prologue + layout.epilogue)
    budget = size_mb * 1e6 - fixed
    count, total = 0, 0
    while total < budget or count == 0:
        total += sizes[count % len(sizes)]
        count += 1
    return count


def generate(src: Path, out: Path, size_mb: float | None = None, steps: int | None = None) -> dict[str, Any]:
    """Write the scaled-up trace; return a small summary."""
    trace = read_trace(src)
    layout = build_layout(trace["traceEvents"])
    n_out = plan_steps(layout, size_mb, steps)
    n_src = len(layout.steps)

    positions = [layout.step_ts[0]]
    for j in range(n_out):
        positions.append(positions[-1] + layout.periods[j % n_src])
    src_end = layout.step_ts[0] + sum(layout.periods)
    extra = positions[-1] - src_end

    head, tail = header_bytes(top_level(trace))
    opener = gzip.open if out.suffix == ".gz" else open
    written = 0
    n_events = 0
    with opener(out, "wb") as fh:  # type: ignore[operator]
        f: BinaryIO = fh
        f.write(head)
        sep = b""

        def emit(ev: Event) -> None:
            nonlocal sep, written, n_events
            chunk = sep + render(ev)
            f.write(chunk)
            written += len(chunk)
            n_events += 1
            sep = b",\n"

        for e in layout.meta:
            emit(e)
        for e in layout.prologue:
            emit(stretch(e, layout, extra))
        for j in range(n_out):
            i, cycle = j % n_src, j // n_src
            shift = positions[j] - layout.step_ts[i]
            offsets = {fam: cycle * span for fam, span in layout.spans.items()}
            step_no = layout.first_step_no + j
            for t in layout.steps[i]:
                emit(copy_event(t, shift, offsets, step_no))
        for e in layout.epilogue:
            emit(shifted(e, extra))
        f.write(tail)
    return {
        "source": str(src),
        "output": str(out),
        "source_steps": n_src,
        "steps": n_out,
        "events": n_events,
        "bytes": written + len(head) + len(tail),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", type=Path, help="recorded Kineto trace (.json, .json.gz or .json.xz)")
    ap.add_argument("out", type=Path, help="output trace (.json, or .json.gz to compress)")
    size = ap.add_mutually_exclusive_group(required=True)
    size.add_argument("--size-mb", type=float, help="approximate uncompressed size in MB (10^6 bytes)")
    size.add_argument("--steps", type=int, help="number of ProfilerStep windows to write")
    args = ap.parse_args(argv)
    summary = generate(args.src, args.out, args.size_mb, args.steps)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
