"""A strict Trace Event Format check, written from the format's specification (the Google
"Trace Event Format" document that chrome://tracing and Perfetto's JSON importer follow).

``check(doc)`` returns a list of problems (empty when the document is valid):

- the document is an object with a ``traceEvents`` list (or a bare list of events);
- every event is an object with a known ``ph``;
- ``pid``/``tid`` are integers or strings (never floats, booleans or null) where present;
  ``pid`` is required on every event except global-scope instants and clock syncs;
- ``ts`` is a finite, non-negative number on every timed event; ``dur`` too on ``X``;
- ``name`` is a string where the phase requires one;
- ``args`` is an object where present; counters (``C``) have only finite numeric args;
- ``B``/``E`` pairs balance per (pid, tid), in time order, and no ``E`` comes first;
- metadata (``M``) events are one of the documented names with the documented argument;
- flow (``s``/``t``/``f``) and async (``b``/``n``/``e``) events carry an ``id``;
- instant scope ``s`` is one of g/p/t.
``load(path)`` parses JSON strictly (no NaN/Infinity, which the format does not allow).
"""

from __future__ import annotations

import gzip
import json
import math
from collections import defaultdict
from pathlib import Path

PHASES = set("BEXiIbneSTpFsftPOND") | {"C", "M", "R", "c", "(", ")", "v", "V"}
_META = {"process_name": ("name", str), "process_labels": ("labels", str), "process_sort_index": ("sort_index", int),
         "thread_name": ("name", str), "thread_sort_index": ("sort_index", int), "process_uptime_seconds": ("uptime", (int, float))}
_NEEDS_NAME = set("XBiICbnesftSTpFNOD")


def _bad_constant(c):
    raise ValueError(f"{c} is not valid JSON")


def load(path) -> dict:
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    elif raw[:6] == b"\xfd7zXZ\x00":
        import lzma

        raw = lzma.decompress(raw)
    return json.loads(raw, parse_constant=_bad_constant)


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _ident(v) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)) or isinstance(v, str)


def check(doc) -> list[str]:
    problems: list[str] = []
    events = doc if isinstance(doc, list) else (doc.get("traceEvents") if isinstance(doc, dict) else None)
    if not isinstance(events, list):
        return ["the document is neither a list of events nor an object with a traceEvents list"]
    stacks: dict = defaultdict(list)
    be = []
    for i, e in enumerate(events):
        where = f"event {i}"
        if not isinstance(e, dict):
            problems.append(f"{where}: not an object")
            continue
        ph = e.get("ph")
        if ph not in PHASES:
            problems.append(f"{where}: unknown ph {ph!r}")
            continue
        global_instant = ph in "iI" and e.get("s") == "g"
        if "pid" in e and not _ident(e["pid"]):
            problems.append(f"{where}: pid {e['pid']!r} is not an integer or string")
        elif "pid" not in e and not global_instant and ph not in "c":
            problems.append(f"{where}: no pid")
        if "tid" in e and not _ident(e["tid"]):
            problems.append(f"{where}: tid {e['tid']!r} is not an integer or string")
        if "args" in e and not isinstance(e["args"], dict):
            problems.append(f"{where}: args is not an object")
        if ph in _NEEDS_NAME and not isinstance(e.get("name"), str):
            problems.append(f"{where}: ph {ph} without a string name")
        if ph != "M":
            if not _num(e.get("ts")):
                problems.append(f"{where}: ts {e.get('ts')!r} is not a finite number")
            elif e["ts"] < 0:
                problems.append(f"{where}: negative ts {e['ts']}")
        if ph == "X":
            d = e.get("dur")
            if not _num(d):
                problems.append(f"{where}: X without a finite numeric dur ({d!r})")
            elif d < 0:
                problems.append(f"{where}: negative dur {d}")
        elif ph == "C":
            a = e.get("args")
            if not isinstance(a, dict) or not a:
                problems.append(f"{where}: counter without args")
            else:
                for k, v in a.items():
                    if not _num(v):
                        problems.append(f"{where}: counter {e.get('name')!r} arg {k!r} = {v!r} is not a finite number")
        elif ph == "M":
            spec = _META.get(e.get("name"))
            if spec is None:
                problems.append(f"{where}: unknown metadata name {e.get('name')!r}")
            else:
                key, typ = spec
                a = e.get("args") if isinstance(e.get("args"), dict) else {}
                if not isinstance(a.get(key), typ) or isinstance(a.get(key), bool):
                    problems.append(f"{where}: {e['name']} needs args.{key} of type {typ}")
        elif ph in "iI":
            if "s" in e and e["s"] not in ("g", "p", "t"):
                problems.append(f"{where}: instant scope {e['s']!r}")
        elif ph in "sftbne":
            if "id" not in e and "id2" not in e:
                problems.append(f"{where}: ph {ph} without id")
        elif ph in "BE" and _num(e.get("ts")):
            be.append((e["ts"], 0 if ph == "E" else 1, i, ph, e.get("pid"), e.get("tid")))
    # balance B/E per thread in time order (an E at the same time as a B closes first)
    for ts, _, i, ph, pid, tid in sorted(be):
        key = (pid, tid)
        if ph == "B":
            stacks[key].append(i)
        elif not stacks[key]:
            problems.append(f"event {i}: E with no open B on pid {pid} tid {tid}")
        else:
            stacks[key].pop()
    for key, open_ in stacks.items():
        if open_:
            problems.append(f"{len(open_)} B event(s) never closed on pid {key[0]} tid {key[1]}")
    return problems
