"""Fixes as transformations of a replay plan: what each change does to the host's work, the
calls and the GPU operations, before the step is replayed.

Each fix names what it changes and the one assumption it rests on (``Fix.assumption``); the
figures it uses are stated here, not tuned per trace:

``remove_syncs``     the selected synchronising calls stop waiting (the value is read later, or
                     kept on the GPU): a sync returns in ``SYNC_OVERHEAD_NS``; a small
                     device-to-host copy (a scalar) no longer holds the host.
``remove_host_work`` the host's work that launches nothing (the input pipeline, the program's own
                     Python) leaves the loop: moved to DataLoader workers or another process.
``fuse_optimizer``   the optimizer's per-parameter kernels become one multi-tensor kernel per
                     kind of update: its host time drops to a range measured from the trace
                     (``_fused_host_ns``: one launch, to one visit a parameter), its GPU time to
                     the largest of its kernels per step plus a quarter of the rest.
``compile``          (target ``outside``: only the eager code outside compiled regions)
                     torch.compile fuses each chain of memory-bound kernels (``FUSIBLE_KERNEL``:
                     pointwise, copies and casts, fills, dropout, reductions, normalisation,
                     softmax) between two library kernels (``LIBRARY_KERNEL``: GEMM, attention,
                     convolution, copies, collectives, the optimizer's multi-tensor kernels),
                     which stay as they are. A chain's reductions keep a kernel each
                     (``REDUCTION_KERNEL``: Inductor emits one per reduction), and each run of
                     pointwise kernels between them one (its longest): the launches Inductor
                     still makes. The fused kernels move the chain's outside reads and
                     writes only, its intermediates staying in registers: together they run
                     as long as the chain's longest kernel and a share of the rest, a range
                     (``FUSED_REST``: none to all of it, which the trace's kernel names do not
                     tell), shared by the kept kernels as they shared the chain's time. A launch that no longer
                     happens takes its dispatch with it, and each remaining kernel's launch
                     costs what it did eager (generated code launches at about eager's cost
                     per kernel).
``cuda_graph``       the step's launches are replayed from one CUDA graph: one launch of
                     ``GRAPH_LAUNCH_NS`` a step, no host work between kernels; syncs and the
                     work that launches nothing stay. Target ``regions``: only the launches
                     inside compiled regions (what ``mode="reduce-overhead"`` captures: the
                     compiled forward and backward), one replay per region; ``outside``: only
                     the launches outside them; ``forward_backward``: of an eager program, only
                     the launches in each step's forward and backward (what
                     ``mode="reduce-overhead"`` captures once the model is compiled: the
                     optimizer, the batch fetch and the code after the backward stay eager;
                     ``graph._forward_backward`` finds the span, and where the trace shows no
                     backward, only the optimizer's ranges are left out), one replay per run of
                     them. The what-if model predicts it as a range: this at the low end and the
                     whole step's launches (a manual capture of the step) at the high end.
``speed_ops``        the selected kernels run ``factor`` times as long (a datasheet ratio: FP32
                     SIMT to TF32 tensor cores, TF32 to BF16).
``pin_copies``       pageable copies run at the pinned rate and no longer hold the host.
``prefetch_copies``  host-to-device copies are issued a step ahead on their own stream: later
                     work no longer waits for them.
``allocator``        expandable segments: no ``cudaFree`` (which synchronises) and no slow
                     ``cudaMalloc`` in the loop.
``add_casts``        each selected kernel's launch is preceded by ``factor`` more eager operators:
                     the casts BF16 autocast adds (a weight to BF16 in the forward, its gradient
                     back in the backward), each at the host cost of the step's median launch
                     (its dispatch and the launch call, as the bare plan has them). Their kernels
                     are not added.
``compress_comm``    the collectives carry ``factor`` of their bytes (a bf16 hook: half), and
                     each pays the casts both ways on the compute stream: three passes over
                     its payload at ``rate_gbps`` (the device's memory bandwidth at a
                     practical share).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple, TypeVar

import numpy as np

from proflab.analysis.whatif.graph import COPY, FREE, LAUNCH, OTHER, SYNC, StepGraph, call_ops
from proflab.analysis.whatif.replay import SYNC_OVERHEAD_NS, Plan
from proflab.model.findings import FIX_KINDS as KINDS
from proflab.model.findings import Fix

T = TypeVar("T")

__all__ = ["Fix", "apply", "LIBRARY_KERNEL", "FUSIBLE_KERNEL", "POINTWISE_KERNEL", "REDUCTION_KERNEL", "KINDS", "RANGED"]

# Fixes whose size the trace does not fix are ranges: ``Fix.factor`` says where in it (0: the
# fix's most favourable end, 1: its least), and the what-if model replays 0.5 for its prediction
# and both ends for the range it states (``RANGED``).
RANGED = ("fuse_optimizer", "compile")
# The memory-bound kernels torch.compile generates itself, by class of the eager kernel's name:
# pointwise (TensorIterator's elementwise kernels, copies and casts, fills, cat), dropout, and
# the reductions, normalisations and softmaxes (``REDUCTION_KERNEL``) whose neighbours Inductor
# fuses into them. Library kernels (``LIBRARY_KERNEL``) are not among them.
POINTWISE_KERNEL = (
    r"(?i)elementwise_kernel|vectorized_elementwise|unrolled_elementwise|copy_kernel|CatArrayBatchedCopy|"
    r"fused_dropout|dropout_kernel|masked_scale"
)
# ... of which a reduction, normalisation or softmax keeps a kernel of its own (Inductor's own
# count on an eager GPT, 262 such kernels a step, was 225, not one a chain): its chain's
# pointwise kernels fuse into it.
REDUCTION_KERNEL = (
    r"(?i)reduce_kernel|layer_norm|LayerNorm|GammaBeta|batch_norm|BatchNorm|group_norm|GroupNorm|rms_?norm|"
    r"SoftMax|softmax|nll_loss|cross_entropy"
)
FUSIBLE_KERNEL = f"{POINTWISE_KERNEL}|{REDUCTION_KERNEL[4:]}"
# A fused chain runs as long as its longest kernel and a share of the rest: none of it (the
# intermediates' traffic all saved) to all of it (only the launches saved). Which share, the
# trace's kernel names do not say: a range, 0-1 (``RANGED``), once a quarter set on the truth set.
FUSED_REST = (0.0, 1.0)
GRAPH_LAUNCH_NS = 20_000
SMALL_COPY_BYTES = 1 << 20  # a device-to-host copy this small is a value read (.item()), not data

# Kernels torch.compile leaves to a library (it calls them as they are) ...
LIBRARY_KERNEL = (
    r"(?i)gemm|nvjet|cutlass|xmma|cublas|sgemm|hgemm|matmul|conv|cudnn|fmha|flash|attention|sdpa|nccl|"
    r"multi_tensor_apply|fused_adam|fused_sgd|FusedOpti|FusedAdam|FusedSGD|memcpy|memset|splitK|cub::|radix|sort|scan|embedding_backward"
)


def _names(g: StepGraph, pattern: str) -> np.ndarray:
    """Which operations' names match ``pattern`` (once per distinct name, and once a graph per
    pattern: a report replays each fix at several profiler costs and range ends)."""
    memo = g.__dict__.setdefault("_names_matching", {})
    got = memo.get(pattern)
    if got is None:
        uniq, inv = _distinct_names(g)
        hit = np.array([bool(re.search(pattern, u)) for u in uniq], dtype=bool)
        got = memo[pattern] = hit[inv] if hit.size else np.zeros(inv.size, dtype=bool)
        got.setflags(write=False)  # shared by every replay of the graph
    return got


def _distinct_names(g: StepGraph, column: str = "op_name") -> tuple[list[str], np.ndarray]:
    """The graph's distinct operation names (``column``: or its calls', ``call_name``) and each
    one's index among them, found once a graph (``build_graph`` hands them over as it makes
    them) by a dictionary of the names: ``np.unique`` of the names as fixed-width text held
    4 bytes a character of the longest name for every operation (a 0.5 GB trace's part of
    100 k kernels: 130 MiB, the peak of its whole analysis)."""
    key = "_distinct_names" if column == "op_name" else f"_distinct_{column}"
    got = g.__dict__.get(key)  # (kept on the graph: a fix asks several times a replay)
    if got is None:
        seen: dict[str, int] = {}
        values = getattr(g, column)
        inv = np.fromiter((seen.setdefault("" if x is None else str(x), len(seen)) for x in values), dtype=np.int64,
                          count=len(values))
        got = g.__dict__[key] = (list(seen), inv)
    return got


def _calls_named(g: StepGraph, test) -> np.ndarray:
    """Which calls' names pass ``test`` (a function of the name), asked once per distinct name."""
    uniq, inv = _distinct_names(g, "call_name")
    hit = np.array([bool(test(u)) for u in uniq], dtype=bool)
    return hit[inv] if hit.size else np.zeros(inv.size, dtype=bool)


def _sums(d: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The sum of each run of ``d`` from each of ``starts`` to the next, each as ``.sum()``
    adds it: ``np.add.reduceat`` adds in order, ``sum`` pairwise, and the predictions stay
    the same to the last bit. Rows of one length summed at once (a loop over the lengths)."""
    size = np.diff(np.append(starts, d.size))
    out = np.empty(starts.size)
    for n in np.unique(size).tolist():
        at = np.flatnonzero(size == n)
        out[at] = d[starts[at][:, None] + np.arange(n)].sum(axis=1)
    return out


_ONCE_KEPT = 4


def _once(g: StepGraph, name: str, inputs: tuple[np.ndarray, ...], make: Callable[[], T]) -> T:
    """``make()``, made once for the plans whose ``inputs`` (the parts of a plan it reads) are
    equal, kept on the graph: a report replays a fix at each profiler cost and each end of its
    range, and most of a fix's work sees the same parts each time (the few latest kept)."""
    seen = g.__dict__.setdefault(name, [])
    for key, value in seen:
        if all(np.array_equal(a, b) for a, b in zip(key, inputs)):
            return value
    value = make()
    seen.append((tuple(a.copy() for a in inputs), value))
    del seen[:-_ONCE_KEPT]
    return value



def _optimizer_steps(g: StepGraph) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per step, the optimizer's calls and their operations in call order (the fused kernel is
    the first of the longest in that order), found once a graph: a report asks for the fix
    a dozen times."""
    got = g.__dict__.get("_optimizer_steps")
    if got is None:
        opt = g.call_optimizer & (g.call_step >= 0)
        _, by_call = call_ops(g)
        got = []
        for s in np.unique(g.call_step[opt]):
            in_step = opt & (g.call_step == s)
            got.append((np.flatnonzero(in_step), by_call[in_step[g.op_call[by_call]]]))
        g.__dict__["_optimizer_steps"] = got
    return got


def _launches_per_parameter(g: StepGraph) -> list[float]:
    """Each optimizer step's launches per parameter (``_fused_host_ns``), from the graph alone:
    found once a graph (the fix is replayed at each profiler cost and each end of its range)."""
    got = g.__dict__.get("_optimizer_per_param")
    if got is None:
        got = []
        for _, every in _optimizer_steps(g):
            if every.size == 0:
                got.append(0.0)
                continue
            _, counts = np.unique(g.op_name[every], return_counts=True)
            got.append(every.size / max(float(np.median(counts)), 1.0))
        g.__dict__["_optimizer_per_param"] = got
    return got


def _fused_host_ns(g: StepGraph, q: Plan, calls: np.ndarray, every: np.ndarray, per_param: float) -> tuple[float, float]:
    """A fused optimizer step's host time (ns), as a range measured from the trace's own step:
    at least one launch at the trace's median host cost of the optimizer's launches (the fused
    kernel's), at most the optimizer's host time over its launches per parameter (the fused
    step still visits every parameter once: one of the loop's visits a parameter). The
    parameters are the optimizer's kernels' median count per kernel name (a per-parameter
    AdamW launches each of its kernels once a parameter)."""
    work = q.work[calls] + q.call_dur[calls]
    launch = work[q.call_kind[calls] == LAUNCH]
    lo = float(np.median(launch)) if launch.size else float(np.median(work)) if work.size else 0.0
    if every.size == 0:
        return lo, lo
    return lo, max(lo, float(work.sum()) / max(per_param, 1.0))


def _fused_kernels(q: Plan, steps: list[tuple[np.ndarray, np.ndarray]], ops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which of the optimizer's operations (``ops``) run fused and for how long (ns): per step,
    its longest kernel alone, for its own time and a quarter of the others'."""
    alive, dur = q.op_alive.copy(), q.op_dur.copy()
    for _, every in steps:
        mine = every[alive[every]]
        if mine.size:
            d = dur[mine]
            keep = mine[int(np.argmax(d))]
            alive[mine] = False
            alive[keep] = True
            dur[keep] = d.max() + 0.25 * (d.sum() - d.max())
    return alive[ops], dur[ops]


def _library(g: StepGraph) -> np.ndarray:
    lib = _names(g, LIBRARY_KERNEL)
    return lib | (g.op_kind != "kernel") | g.op_comm


class _Chains(NamedTuple):
    """What compile's chains are made of that no plan changes, found once a graph (a report
    replays the fix at each profiler cost and each end of its range: 60 times on a
    generation trace): the calls it compiles, its operations in launch order, which of them
    it may fuse and which are reductions (in that order), and where a neighbour is of the
    same step and stream."""

    inside: np.ndarray  # per call
    order: np.ndarray  # the operations in launch order
    fusible: np.ndarray  # per operation, in launch order
    reduction: np.ndarray  # per operation, in launch order
    neighbours: np.ndarray  # [i]: operations i and i + 1 (launch order) of one step and stream


def _chains(g: StepGraph) -> _Chains:
    got = g.__dict__.get("_compile_chains")
    if got is None:
        inside = (g.call_step >= 0) & ~g.call_optimizer & ~g.region  # compiled code is not compiled again
        fusible = _names(g, FUSIBLE_KERNEL) & ~_library(g) & inside[g.op_call]
        order = np.lexsort((g.op_start, g.call_start[g.op_call]))
        step, stream = g.call_step[g.op_call][order], g.op_stream[order]
        neighbours = (step[1:] == step[:-1]) & (stream[1:] == stream[:-1])
        got = g.__dict__["_compile_chains"] = _Chains(inside, order, fusible[order], _names(g, REDUCTION_KERNEL)[order],
                                                      neighbours)
    return got


def _compiled_ops(g: StepGraph, c: _Chains, q: Plan, share: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compile's operations: which still run, their durations (ns), and which calls still
    launch one, from the plan's own and ``share`` of a chain's other kernels' time its
    fused kernel keeps (``FUSED_REST``'s range). A function of those alone, so found once for
    the plans that share them (the fix replayed at each profiler cost changes the host, not
    these) and handed out as copies (a later fix edits its plan in place)."""
    alive, dur, live = _once(g, f"_compiled_ops:{share}", (q.op_alive, q.op_dur), lambda: _fused_chains(g, c, q, share))
    return alive.copy(), dur.copy(), live


def _fused_chains(g: StepGraph, c: _Chains, q: Plan, share: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_compiled_ops``'s, worked out."""
    alive, dur = q.op_alive.copy(), q.op_dur.copy()
    order = c.order
    # chains: runs of fusible operations of one step and stream, consecutive in launch order
    f = c.fusible & alive[order]
    joins = np.zeros(order.size, dtype=bool)
    joins[1:] = f[1:] & f[:-1] & c.neighbours
    member = np.flatnonzero(f)  # (a chain's operations are consecutive members)
    size = np.bincount(np.cumsum(~joins[member]) - 1)
    long = member[np.repeat(size > 1, size)]
    if long.size:
        head = ~joins[long]
        chain_of = np.cumsum(head) - 1
        at = order[long]
        d = dur[at]
        starts = np.flatnonzero(head)
        longest = np.maximum.reduceat(d, starts)
        total = _sums(d, starts)
        # per chain, its reductions keep their kernels, and each run of pointwise kernels
        # between them runs as its longest (the first of equals): the launches Inductor
        # still makes
        red = c.reduction[long]
        run_head = head.copy()
        run_head[1:] |= red[:-1] | red[1:]
        run_of = np.cumsum(run_head) - 1
        run_max = np.zeros(run_of[-1] + 1)
        np.maximum.at(run_max, run_of[~red], d[~red])
        is_max = np.flatnonzero(~red & (d == run_max[run_of]))
        _, first_max = np.unique(run_of[is_max], return_index=True)
        kept = red.copy()
        kept[is_max[first_max]] = True
        # the fused chain moves its longest kernel's bytes and a share of the rest (its
        # intermediates no longer go through memory), shared by its kept kernels as they
        # shared the chain's own time
        rest = FUSED_REST[0] + share * (FUSED_REST[1] - FUSED_REST[0])
        fused = longest + rest * (total - longest)
        base = np.bincount(chain_of, weights=np.where(kept, d, 0.0), minlength=starts.size)
        alive[at] = kept
        dur[at[kept]] = d[kept] * (fused / np.maximum(base, 1e-9))[chain_of[kept]]
    live = np.zeros(g.n_calls, dtype=bool)
    live[g.op_call[alive]] = True
    live.setflags(write=False)
    return alive, dur, live


def apply(g: StepGraph, p: Plan, *fixes: Fix) -> Plan:
    """``p`` with ``fixes`` made in turn (a new plan, copied once; ``p`` is left as it was)."""
    q = p.copy()
    for fix in fixes:
        getattr(_Apply, fix.kind)(g, q, fix)
    return q


class _Apply:
    @staticmethod
    def remove_syncs(g: StepGraph, q: Plan, fix: Fix) -> None:
        names = set(filter(None, fix.target.split("|")))
        inside = g.call_step >= 0
        sync = (q.call_kind == SYNC) & inside
        if names:
            sync &= _calls_named(g, names.__contains__)
        q.call_kind[sync] = OTHER
        q.call_dur[sync] = np.minimum(q.call_dur[sync], SYNC_OVERHEAD_NS)
        # a small device-to-host copy the host waited for is a value read: it no longer waits
        small = g.op_pageable & (g.op_bytes < SMALL_COPY_BYTES) & (g.op_bytes > 0)
        reads = np.unique(g.op_call[small])
        reads = reads[(q.call_kind[reads] == COPY) & inside[reads]]
        q.call_kind[reads] = LAUNCH
        q.call_dur[reads] = np.minimum(q.call_dur[reads], SYNC_OVERHEAD_NS)

    @staticmethod
    def remove_host_work(g: StepGraph, q: Plan, fix: Fix) -> None:
        part = {"loader": q.loader, "quiet": q.quiet}.get(fix.target)
        taken = q.loader + q.quiet if part is None else part
        q.work = np.maximum(q.work - taken, 0.0)
        if fix.target in ("loader", ""):
            q.loader = np.zeros_like(q.loader)
        if fix.target in ("quiet", ""):
            q.quiet = np.zeros_like(q.quiet)

    @staticmethod
    def fuse_optimizer(g: StepGraph, q: Plan, fix: Fix) -> None:
        steps = _optimizer_steps(g)
        if not steps:
            return
        calls, ops = (np.concatenate([part[i] for part in steps]) for i in (0, 1))
        host = np.array(_once(g, "_fused_host", (q.work[calls], q.call_dur[calls], q.call_kind[calls]), lambda: [
            _fused_host_ns(g, q, c, every, per_param) for (c, every), per_param in zip(steps, _launches_per_parameter(g))]))
        # per step, the fused step's host time on its first call (``_fused_host_ns``'s range at
        # the fix's share of it), its other calls gone
        first = np.array([c[0] for c, _ in steps])
        q.work[calls] = 0.0
        q.call_dur[np.concatenate([c[1:] for c, _ in steps])] = 0.0
        q.work[first] = host[:, 0] + min(max(fix.factor, 0.0), 1.0) * (host[:, 1] - host[:, 0])
        q.op_alive[ops], q.op_dur[ops] = _once(g, "_fused_kernels", (q.op_alive[ops], q.op_dur[ops]),
                                               lambda: _fused_kernels(q, steps, ops))

    @staticmethod
    def compile(g: StepGraph, q: Plan, fix: Fix) -> None:
        c = _chains(g)
        q.op_alive, q.op_dur, live = _compiled_ops(g, c, q, min(max(fix.factor, 0.0), 1.0))
        # host: a launch that no longer happens costs nothing, its dispatch with it; the
        # generated code launches each remaining kernel at about eager's cost per kernel
        # (an H200 host: 27 us a launch compiled against 21 us eager, tests/data/gains)
        gone = c.inside & (q.call_kind == LAUNCH) & ~live
        taken = q.loader + q.quiet
        q.work = np.where(gone, np.minimum(q.work, taken), q.work)
        q.call_dur = np.where(gone, 0.0, q.call_dur)

    @staticmethod
    def cuda_graph(g: StepGraph, q: Plan, fix: Fix) -> None:
        inside = g.call_step >= 0
        if fix.target == "regions":
            inside = inside & g.region
        elif fix.target == "outside":
            inside = inside & ~g.region
        elif fix.target == "forward_backward":
            inside = inside & (g.call_fwbw if g.call_fwbw is not None else ~g.call_optimizer)
        replayed = inside & ((q.call_kind == LAUNCH) | (q.call_kind == OTHER))
        taken = q.loader + q.quiet
        q.work = np.where(replayed, np.minimum(q.work, taken), q.work)
        q.call_dur = np.where(replayed, 0.0, q.call_dur)
        # one replay a step, or one a region: a run of replayed calls that no other call breaks
        idx = np.flatnonzero(replayed)
        if fix.target in ("regions", "forward_backward") and idx.size:
            starts = idx[np.concatenate([[True], (np.diff(idx) > 1) | (np.diff(g.call_step[idx]) != 0)])]
        else:
            starts = idx[np.unique(g.call_step[idx], return_index=True)[1]]
        q.work[starts] += GRAPH_LAUNCH_NS

    @staticmethod
    def speed_ops(g: StepGraph, q: Plan, fix: Fix) -> None:
        sel = _names(g, fix.target) & (g.op_kind == "kernel")
        q.op_dur = np.where(sel, q.op_dur * fix.factor, q.op_dur)

    @staticmethod
    def pin_copies(g: StepGraph, q: Plan, fix: Fix) -> None:
        sel = g.op_pageable & (g.op_bytes > 0)
        if fix.rate_gbps > 0:
            q.op_dur = np.where(sel, np.minimum(q.op_dur, g.op_bytes / fix.rate_gbps), q.op_dur)
        calls = np.unique(g.op_call[sel])
        calls = calls[q.call_kind[calls] == COPY]
        q.call_kind[calls] = LAUNCH
        q.call_dur[calls] = np.minimum(q.call_dur[calls], SYNC_OVERHEAD_NS)

    @staticmethod
    def prefetch_copies(g: StepGraph, q: Plan, fix: Fix) -> None:
        h2d = (g.op_copy == "HtoD") & (g.op_bytes >= SMALL_COPY_BYTES)
        q.op_free = q.op_free | h2d
        q.op_stream = np.where(h2d, -2, q.op_stream)

    @staticmethod
    def allocator(g: StepGraph, q: Plan, fix: Fix) -> None:
        free = q.call_kind == FREE
        q.call_kind[free] = OTHER
        q.call_dur[free] = np.minimum(q.call_dur[free], SYNC_OVERHEAD_NS)
        malloc = _calls_named(g, lambda n: n.startswith(("cudaMalloc", "cuMemAlloc")))
        q.call_dur = np.where(malloc, np.minimum(q.call_dur, 20_000.0), q.call_dur)

    @staticmethod
    def compress_comm(g: StepGraph, q: Plan, fix: Fix) -> None:
        comm = np.flatnonzero(g.op_comm)
        q.op_dur[comm] = q.op_dur[comm] * fix.factor
        if fix.rate_gbps <= 0:
            return
        # the casts run on the compute stream (DDP's hook casts each bucket as it is ready,
        # and back once reduced): on the work the collective waited for, else on itself
        casts = 3.0 * g.op_comm_bytes[comm] / fix.rate_gbps
        on = np.where(q.op_dep[comm] >= 0, q.op_dep[comm], comm)
        np.add.at(q.op_dur, on, casts)

    @staticmethod
    def add_casts(g: StepGraph, q: Plan, fix: Fix) -> None:
        # (the median launch of the plan as the fix finds it: the bare one, at the profiler's
        # cost being replayed)
        inside = g.call_step >= 0
        sel = _names(g, fix.target) & (g.op_kind == "kernel")
        calls = g.op_call[sel]
        calls = calls[inside[calls]]
        launch = (q.call_kind == LAUNCH) & inside
        if not calls.size or not launch.any():
            return
        per_op = float(np.median(q.work[launch] + q.call_dur[launch]))
        np.add.at(q.work, calls, fix.factor * per_op)
