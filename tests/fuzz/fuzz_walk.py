"""Coverage-guided fuzzer of the what-if replay's walk (``_replay.c``), built with ASan, UBSan and
libFuzzer's counters (``native.py``): each input is read as a step graph and a plan (``graph``:
the calls, their operations, streams, dependencies, durations; indices out of range included),
and the walk either refuses it (ValueError, nothing written) or gives the Python walk's floats
bit for bit. Run through ``run.py``: ``python tests/fuzz/run.py walk --seconds 60``.

``one`` runs without atheris too (the committed corpus through the ordinary build:
``tests/test_replay_native.py``)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np

_KINDS = (0, 1, 2, 3, 4)  # LAUNCH, SYNC, COPY, FREE, OTHER (graph.py)


def graph(data: bytes):
    """The walk's arguments and a graph for the Python walk, from ``data``, or None where it
    is too short. Byte 0-1: calls and operations; 2: what to damage where its bit 7 is set (bit 0
    an operation's stream, 1 a dependency, 2 the offsets, 3 an operation index: half of all
    inputs are whole graphs); then the arrays, each from the bytes that follow, repeated to
    length."""
    if len(data) < 8:
        return None
    n, m, damage = data[0] % 48 + 1, data[1] % 64, data[2] if data[2] & 128 else 0
    rest = np.frombuffer(data[3:], dtype=np.uint8)
    at = [0]

    def take(k: int) -> np.ndarray:  # k bytes, cycling through the input
        idx = (at[0] + np.arange(k)) % rest.size
        at[0] = (at[0] + k) % rest.size
        return rest[idx].astype(np.int64)

    kind = np.array(_KINDS, dtype=np.int8)[take(n) % 5]
    op_call = np.sort(take(m) % n)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(op_call, minlength=n), out=ptr[1:])
    ops = np.argsort(op_call, kind="stable").astype(np.int64)
    n_streams = int(take(1)[0] % 4) + 1
    stream = take(m) % n_streams
    dep = take(m) % (m + 1) - 1  # -1: none
    ns = lambda k: take(k) * 997.25  # noqa: E731  (fractional, as a fix's scaled durations are)
    work, call_dur, op_dur, gap = ns(n), ns(n), ns(m), (take(m) * 50).astype(np.float64)
    alive, free = take(m) % 5 != 0, take(m) % 7 == 0
    not_before = np.where(take(m) % 3 == 0, ns(m) * 4, 0.0)
    lat, wake = float(take(1)[0] * 40), float(take(1)[0] * 40)
    if m and damage & 1:
        stream[int(take(1)[0]) % m] = n_streams + int(take(1)[0])
    if m and damage & 2:
        dep[int(take(1)[0]) % m] = m + int(take(1)[0]) if damage & 16 else -2 - int(take(1)[0])
    if damage & 4:
        ptr[int(take(1)[0]) % (n + 1)] += int(take(1)[0]) - 128
    if m and damage & 8:
        ops[int(take(1)[0]) % m] = m + int(take(1)[0])
    args = (work, call_dur, kind, ptr, ops, op_dur, alive, stream, n_streams, dep, free, not_before, gap, lat, wake, 8000.0,
            (0, 1, 2, 3), np.zeros(n), np.full(m, np.nan), np.full(m, np.nan), np.full(m, np.nan))  # fmt: skip
    valid = not damage & 15 or m == 0 and not damage & 4
    g = SimpleNamespace(n_calls=n, latency_ns=lat, wake_ns=wake, op_gap=gap, _call_ops=(ptr, ops))
    plan = SimpleNamespace(work=work, call_dur=call_dur, call_kind=kind, op_dur=op_dur, op_alive=alive, op_stream=stream,
                           op_dep=dep, op_free=free, op_not_before=not_before)  # fmt: skip
    return args, (g, plan) if valid else None


def one(data: bytes, walk=None) -> None:
    from proflab.analysis.whatif import replay

    walk = walk or replay._native.walk
    got = graph(data)
    if got is None:
        return
    args, reference = got
    outputs = [a.copy() for a in args[-4:]]
    try:
        walk(*args)
    except ValueError:
        # refused before anything was written
        assert all(a.tobytes() == b.tobytes() for a, b in zip(args[-4:], outputs))
        assert reference is None, "a valid graph was refused"
        return
    if reference is None:
        return  # (damage that left every index in range: an offset moved within the operations)
    g, plan = reference
    py = [np.zeros(g.n_calls), *(np.full(len(plan.op_dur), np.nan) for _ in range(3))]
    replay._walk_py(g, plan, *py)
    for name, a, b in zip(("call_start", "op_start", "op_end", "op_ready"), args[-4:], py):
        assert a.tobytes() == b.tobytes(), name


if __name__ == "__main__":
    import atheris

    from native import load

    module = load("walk", sys.argv[1])

    atheris.Setup([sys.argv[0], *sys.argv[2:]], lambda data: one(data, module.walk))
    atheris.Fuzz()
