"""Tolerant decoding of Kineto events: a value of an unexpected type costs that value, not the trace.

The reader decodes every slice with strict typed structs (the fast path). Only a slice whose
strict decode fails comes here: it is decoded again into loose structs with the same attribute
names, whose fields accept any JSON value, and each field is then checked a column at a time.
A value that is unambiguous is coerced (``"7"`` or ``7.0`` for an integer id, ``"0x1f"`` for a
stream handle, ``"12.5"`` for a timestamp); anything else is dropped for that event (an event
whose ``ts`` or ``dur`` cannot be read is dropped whole, having no place on the timeline). Every
change is counted as (field, what the value was, what was done), for the report's notes.

Real cases this exists for: Triton launches whose ``cpu_op`` carries ``"grid": "grid(100,)"``
(torch.compile traces), ROCm traces whose runtime calls carry ``"stream"`` as a string, traces
rewritten by other tools.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from operator import attrgetter
from typing import Any

import msgspec
from msgspec import Struct, field

__all__ = ["LooseArgs", "LooseEvent", "LOOSE_EVENTS", "loose_events", "from_python", "sanitize", "notes", "kind", "Problems"]

# (field, what the value was, what was done) -> count
Problems = Counter


class LooseArgs(Struct, gc=False):
    """``kineto._Args`` with every field accepting any JSON value (same attribute names)."""

    external_id: Any = field(name="External id", default=None)
    external_id_old: Any = field(name="external id", default=None)
    correlation: Any = None
    device: Any = None
    stream: Any = None
    bytes: Any = None
    grid: Any = None
    block: Any = None
    registers: Any = field(name="registers per thread", default=None)
    shared_memory: Any = field(name="shared memory", default=None)
    python_id: Any = field(name="Python id", default=None)
    python_parent_id: Any = field(name="Python parent id", default=None)
    sequence: Any = field(name="Sequence number", default=None)
    input_types: msgspec.Raw = field(name="Input type", default=msgspec.Raw())
    input_dims: msgspec.Raw = field(name="Input Dims", default=msgspec.Raw())
    input_concrete: msgspec.Raw = field(name="Concrete Inputs", default=msgspec.Raw())
    collective: Any = field(name="Collective name", default=None)
    in_nelems: Any = field(name="In msg nelems", default=None)
    out_nelems: Any = field(name="Out msg nelems", default=None)
    dtype: Any = None
    pg_name: Any = field(name="Process Group Name", default=None)
    group_size: Any = field(name="Group size", default=None)


_NO_ARGS = LooseArgs()


class LooseEvent(Struct, gc=False):
    ph: Any = ""
    cat: Any = ""
    name: Any = ""
    pid: Any = 0
    tid: Any = 0
    ts: Any = None  # missing: left None, and the reader drops the event if it uses it
    dur: Any = 0.0
    args: LooseArgs | None = None  # sanitize() puts _NO_ARGS in its place
    id: Any = None  # flow events; only an integer id is used


LOOSE_EVENTS = msgspec.json.Decoder(list[LooseEvent])
_RAW_ARGS = ("Input type", "Input Dims", "Concrete Inputs")  # kept raw: what msgspec.convert cannot rebuild
_ANY = msgspec.json.Decoder()

_I32 = (-(2**31), 2**31 - 1)
_I64 = (-(2**63), 2**63 - 1)
_US = 9.2e15  # microseconds whose nanoseconds fit in int64

# args fields holding one integer, with their bounds; ids and handles may be hex strings
_INT_ARGS = {
    "external_id": ("External id", _I64),
    "external_id_old": ("external id", _I64),
    "correlation": ("correlation", _I64),
    "device": ("device", _I32),
    "stream": ("stream", _I64),
    "bytes": ("bytes", _I64),
    "registers": ("registers per thread", _I32),
    "shared_memory": ("shared memory", _I64),
    "python_id": ("Python id", _I64),
    "python_parent_id": ("Python parent id", _I64),
    "sequence": ("Sequence number", _I64),
    "in_nelems": ("In msg nelems", _I64),
    "out_nelems": ("Out msg nelems", _I64),
    "group_size": ("Group size", _I32),
}
_INT_TEXT = re.compile(r"\s*[-+]?\d+\s*")
_HEX_TEXT = re.compile(r"\s*0[xX][0-9a-fA-F]+\s*")


def loose_events(payload) -> tuple[list[LooseEvent], Problems]:
    """Events of a JSON array that the strict decoder refused, with their problems fixed."""
    problems: Problems = Counter()
    try:
        events = LOOSE_EVENTS.decode(payload)
    except msgspec.ValidationError:
        # an event that is not an object, or whose args is not one: go item by item
        events = from_python(_ANY.decode(payload), problems)
    return sanitize(events, problems), problems


def from_python(items: Any, problems: Problems) -> list[LooseEvent]:
    """Loose events from already decoded JSON (a list of objects): items that are not events
    are counted and dropped, an ``args`` that is not an object is dropped."""
    if not isinstance(items, list):
        return []
    out = []
    for item in items:
        if not isinstance(item, dict):
            problems["event", kind(item), "not an event, ignored"] += 1
            continue
        args = item.get("args")
        if args is not None and not isinstance(args, dict):
            problems["args", kind(args), "ignored"] += 1
            item = {k: v for k, v in item.items() if k != "args"}
        elif isinstance(args, dict) and any(k in args for k in _RAW_ARGS):
            item = {**item, "args": {k: v for k, v in args.items() if k not in _RAW_ARGS}}
        try:
            out.append(msgspec.convert(item, LooseEvent))
        except msgspec.ValidationError:
            problems["event", "malformed", "ignored"] += 1
    return out


def sanitize(events: list[LooseEvent], problems: Problems) -> list[LooseEvent]:
    """Make every field hold what the strict structs would: coerce or drop, and count."""
    if not events:
        return events
    get = attrgetter
    for attr in ("ph", "cat", "name"):
        values = list(map(get(attr), events))
        for i in [i for i, v in enumerate(values) if type(v) is not str]:
            v = values[i]
            if attr == "name" and v is not None and type(v) is not dict and type(v) is not list:
                setattr(events[i], attr, msgspec.json.encode(v).decode())
                problems[attr, kind(v), "read as text"] += 1
            else:
                setattr(events[i], attr, "")
                problems[attr, kind(v), "event ignored" if attr == "cat" else "ignored"] += 1
    for attr in ("pid", "tid"):
        values = list(map(get(attr), events))
        for i in _bad(values, lambda v: type(v) is int or type(v) is str):
            v = values[i]
            fixed = _as_int(v, _I64, hex_ok=False)
            setattr(events[i], attr, fixed)
            problems[attr, kind(v, _I64), "ignored" if fixed is None else "read as an integer"] += 1
    drop: set[int] = set()
    for attr in ("ts", "dur"):
        values = list(map(get(attr), events))
        # a ts that is missing or null stays None: the reader drops (and counts) the events it
        # would place on the timeline, and ignores the rest as it would anyway
        for i in [i for i, v in enumerate(values) if not _is_us(v) and (v is not None or attr == "dur")]:
            v = values[i]
            fixed = _as_us(v)
            if fixed is None:
                drop.add(i)
                problems[attr, kind(v, (-_US, _US)), "event dropped"] += 1
            else:
                setattr(events[i], attr, fixed)
                problems[attr, kind(v), "read as a number"] += 1
    if drop:
        events = [e for i, e in enumerate(events) if i not in drop]
    args = list(map(get("args"), events))
    for i in [i for i, a in enumerate(args) if a is None]:
        events[i].args = args[i] = _NO_ARGS  # all null: never changed below
    for attr, (key, bounds) in _INT_ARGS.items():
        values = list(map(get(attr), args))
        lo, hi = bounds
        for i in _bad(values, lambda v: type(v) is int and lo <= v <= hi):
            v = values[i]
            fixed = _as_int(v, bounds, hex_ok=True)
            setattr(args[i], attr, fixed)
            problems[f"args.{key}", kind(v, bounds), "ignored" if fixed is None else "read as an integer"] += 1
    for attr, key in (("collective", "Collective name"), ("dtype", "dtype"), ("pg_name", "Process Group Name")):
        values = list(map(get(attr), args))
        for i in _bad(values, lambda v: type(v) is str or (attr == "pg_name" and type(v) is int)):
            problems[f"args.{key}", kind(values[i]), "ignored"] += 1
            setattr(args[i], attr, None)
    for attr in ("grid", "block"):
        values = list(map(get(attr), args))
        for i in _bad(values, _is_dim3):
            problems[f"args.{attr}", kind(values[i], _I32), "ignored"] += 1
            setattr(args[i], attr, None)
    return events


def _bad(values: list, ok) -> list[int]:
    return [i for i, v in enumerate(values) if v is not None and not ok(v)]


def _is_us(v) -> bool:
    return (type(v) is float or type(v) is int) and -_US <= v <= _US


def _is_dim3(v) -> bool:
    return type(v) is list and 0 < len(v) <= 3 and all(type(x) is int and _I32[0] <= x <= _I32[1] for x in v)


def _as_us(v) -> float | None:
    if type(v) is str:
        try:
            v = float(v)
        except ValueError:
            return None
    if type(v) in (int, float) and math.isfinite(v) and -_US <= v <= _US:
        return float(v)
    return None


def _as_int(v, bounds: tuple[int, int], *, hex_ok: bool) -> int | None:
    out = None
    if type(v) is float and v.is_integer():
        out = int(v)
    elif type(v) is str:
        if _INT_TEXT.fullmatch(v):
            out = int(v)
        elif hex_ok and _HEX_TEXT.fullmatch(v):
            out = int(v, 16)
    if out is not None and bounds[0] <= out <= bounds[1]:
        return out
    return None


def kind(v, bounds: tuple[int, int] | None = None) -> str:
    if v is None:
        return "null"
    if type(v) is bool:
        return "a boolean"
    if type(v) is str:
        return "a string"
    if type(v) is int:
        return "out of range" if bounds else "a number"
    if type(v) is float:
        if not math.isfinite(v) or abs(v) > _US:
            return "out of range"
        return "a fractional number" if bounds else "a number"
    if type(v) is list:
        return "an array"
    if type(v) is dict:
        return "an object"
    return type(v).__name__


def notes(problems: Problems) -> list[str]:
    """One line per (field, kind, outcome), most frequent first:
    ``args.grid: 1 value was a string, ignored``."""
    out = []
    for (fld, kind, outcome), n in problems.most_common():
        if kind == "out of range":
            what = f"{n} value was out of range" if n == 1 else f"{n} values were out of range"
        elif fld == "event":
            what = f"{n} item was {kind}" if n == 1 else f"{n} items were {_plural(kind)}"
        else:
            what = f"{n} value was {kind}" if n == 1 else f"{n} values were {_plural(kind)}"
        out.append(f"{fld}: {what}, {outcome}")
    return out


def _plural(kind: str) -> str:
    return {
        "a string": "strings",
        "a boolean": "booleans",
        "a number": "numbers",
        "a fractional number": "fractional numbers",
        "an array": "arrays",
        "an object": "objects",
        "null": "null",
        "malformed": "malformed",
    }.get(kind, kind)
