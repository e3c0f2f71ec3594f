"""The analysis context: every table computed at most once, shared by all rules."""

from __future__ import annotations

from functools import cached_property

import polars as pl

from proflab._heap import release
from proflab.analysis.timeline import event_cost as _event_cost
from proflab.analysis.timeline import gaps as _gaps
from proflab.analysis.timeline import kernels as _kernels
from proflab.analysis.timeline import launch as _launch
from proflab.analysis.timeline import memcpy as _memcpy
from proflab.analysis.timeline import observer as _observer
from proflab.analysis.timeline import ranges as _ranges
from proflab.analysis.timeline import steps as _steps
from proflab.analysis.timeline import breakdown as _timeline
from proflab.analysis.timeline.intervals import IntervalSet
from proflab.analysis.timeline.source import FrameIndex
from proflab.model import Trace
from proflab.model.findings import Missing

__all__ = ["Context", "tokens_as_steps"]


class _table(cached_property):
    """A table (or a figure read from tables) built once per context; once built, the C heap's
    freed memory goes back to the system (``proflab._heap``: the analysis commands' numpy
    temporaries are reused from the heap while a table is built, and released after it)."""

    def __get__(self, instance, owner=None):
        value = super().__get__(instance, owner)
        if instance is not None:
            release()
        return value


class Context:
    """Lazy, cached analyses of one trace. Rules read from it and record missing signals."""

    def __init__(self, trace: Trace, *, bare_step_ms: float | None = None, part: bool = False,
                 starts_at: int | None = None, host_before: pl.DataFrame | None = None) -> None:
        """``bare_step_ms``: the loop's step time measured without the profiler, when known
        (it replaces the observer model's estimate, see ``analysis.timeline.observer``). ``part``: the
        trace is one of the consecutive parts of a trace analysed in parts
        (``report.combine``): what the parts' report is combined from but the report does not
        hold (value counts for medians, per-step figures) is kept in ``part_digest`` as the
        tables it is read from are built, since some are freed once read. ``starts_at``
        (ns): where the analysed span starts in place of :attr:`window`'s own choice (such a
        part's: where the part before it ends, so that the parts' spans meet). ``host_before``:
        such a part's threads' latest host event ends in the parts before it
        (``observer.host_reach``), which its host-only spans are found from."""
        self.trace = trace
        self._starts_at = starts_at
        self._host_before = host_before
        self.bare_step_ms = bare_step_ms
        self.part_digest: dict | None = {} if part else None
        self._missing: dict[str, Missing] = {}

    # -- bookkeeping ---------------------------------------------------------------------
    def note_missing(self, signal: str, reason: str, *skipped: str) -> None:
        prev = self._missing.get(signal)
        merged = tuple(dict.fromkeys((*(prev.skipped if prev else ()), *skipped)))
        self._missing[signal] = Missing(signal, reason, merged)

    def free_device_levels(self, *keep: str) -> None:
        """Build the step table, ``keep`` and all activity (``busy``) from the device sets'
        levels (compute, +communication, +memcpy), then free the levels: the gaps and the
        report read only all activity, and the gaps' temporaries then never sit beside them
        (the 1 GB export: 1,449 -> 1,385 MiB for a query of its gaps). What reads the levels
        later builds them again."""
        for name in ("step_table", *keep, "busy"):
            getattr(self, name)
        self.drop("device_sets")

    @property
    def missing(self) -> tuple[Missing, ...]:
        return tuple(self._missing.values())

    def drop(self, *names: str) -> None:
        """Free these cached tables; the next use computes them again (report assembly frees
        the kernel rows once the small tables read from them are built)."""
        for name in names:
            self.__dict__.pop(name, None)

    # -- timeline ------------------------------------------------------------------------
    @_table
    def window(self) -> tuple[int, int]:
        """The analysed span (ns): the GPU-side steps where the trace has them (what the GPU
        did for those steps, not the host's earlier start), else the trace's own window. A
        part of a trace analysed in parts runs from ``starts_at`` and reaches to the next
        part's first work (``TraceMeta.next_part_work``)."""
        g = self.gpu_steps
        lo, hi = (int(g["start_ns"].min()), int(g["end_ns"].max())) if g.height else self.trace.window_ns
        if self.trace.meta.next_part_work:  # a part's span reaches to the next part's work
            hi = max(hi, *(w.start_ns for w in self.trace.meta.next_part_work))
        if self._starts_at is not None:
            lo, hi = self._starts_at, max(hi, self._starts_at)
        return lo, hi

    @property
    def wall_ns(self) -> int:
        lo, hi = self.window
        return max(hi - lo, 0)

    @_table
    def device_sets(self) -> dict[int, dict[str, IntervalSet]]:
        return _timeline.device_sets(self.trace)

    @_table
    def busy(self) -> dict[int, IntervalSet]:
        return {d: s["memset"] for d, s in self.device_sets.items()}

    @_table
    def device_breakdowns(self) -> dict[int, _timeline.Breakdown]:
        lo, hi = self.window
        if self.part_digest is not None:
            # the parts' work is counted inside the combined span: from the first part's start
            # to the last part's end
            first, last = self._starts_at is None, not self.trace.meta.next_part_work
            self.part_digest["levels"] = _timeline.part_levels(self.device_sets, lo, self.trace.meta.next_part_work,
                                                               within=(lo if first else -(2**62), hi if last else 2**62))
        return {d: _timeline.window_breakdown(s, lo, hi) for d, s in self.device_sets.items()}

    @_table
    def gpu_steps(self) -> pl.DataFrame:
        """GPU-side step windows per device (see ``analysis.timeline.steps``)."""
        return _steps.gpu_steps(self.trace, self.launches)

    @_table
    def step_table(self) -> pl.DataFrame:
        """Per step and device: the GPU-side window (host range where work cannot be tied)."""
        return _timeline.step_table(self.trace, self.device_sets, self.gpu_steps)

    @_table
    def launches(self) -> pl.DataFrame:
        """Host runtime/driver calls by correlation id (see ``gaps.launch_calls``)."""
        return _gaps.launch_calls(self.trace)

    @_table
    def frames(self) -> FrameIndex:
        """The trace's Python frames, indexed for source-line lookups (empty without stacks)."""
        return FrameIndex(self.trace)

    @_table
    def event_cost(self) -> _event_cost.EventCost:
        """The profiler's cost per recorded host event (see ``analysis.timeline.event_cost``):
        measured from the trace where it holds a generation loop, where bare runs confirm it (12
        of 15 H100 generate() cases' unprofiled TPOT and tokens/s within 10%, 9 of 15 TTFT; of the
        6 held-out cases, 5 TPOT and tokens/s, 4 TTFT: benchmarks/inference_truth.py); the
        observer model's range elsewhere: on the training loops of tests/data/realistic (an
        H200, another PyTorch) the gaps put 2.3-4.9 us on an event where those loops' measured
        host time says less, and a measured step's calibration found 3.3 us where a
        per-parameter optimizer's gaps said 1.4-2.5."""
        cost = _event_cost.measure(self.trace) if self.inference.found else _event_cost.DEFAULT
        if self.part_digest is not None:
            self.part_digest["event_cost"] = cost
        return cost

    @_table
    def observer(self) -> _observer.Observer | None:
        """The profiler's own cost and the unprofiled step (see ``analysis.timeline.observer``)."""
        per_step = _observer.step_figures(self.trace, self.step_table, self.blocking, self.launches, self.host_only,
                                          self.event_cost)  # fmt: skip
        if self.part_digest is not None:
            self.part_digest["observer_steps"] = per_step
        return _observer.from_steps(per_step, self.bare_step_ms, self.event_cost)

    @_table
    def blocking(self) -> pl.DataFrame:
        """Host calls that block until the GPU drains (see ``gaps.blocking_calls``)."""
        return _gaps.blocking_calls(self.trace)

    @_table
    def host_only(self) -> pl.DataFrame:
        """Host spans of work that launches nothing (see ``observer.host_only_spans``)."""
        return _observer.host_only_spans(self.trace, self.launches, self._host_before)

    @_table
    def gaps(self) -> pl.DataFrame:
        return _gaps.idle_gaps(self.trace, self.busy, self.window, self.launches, self.step_table, self.blocking)

    @_table
    def whatif(self):
        """The what-if model: the step replayed with a fix (see ``analysis.whatif``)."""
        from proflab._timings import phase
        from proflab.analysis.whatif.model import WhatIf

        with phase("what-if"):
            return WhatIf.of(self.trace, self)

    @_table
    def compiled(self):
        """What torch.compile and CUDA graphs did in the trace (see ``timeline.compiled``), with
        ``proflab run``'s record of Dynamo where the trace comes from a run directory."""
        from proflab.analysis.timeline.compiled import compiled_view
        from proflab.readers.rundir import compile_record_of

        source = self.trace.meta.source
        return compiled_view(self.trace, self.launches, self.kernel_ops, compile_record_of(source) if source else None,
                             self.regions)

    @_table
    def regions(self):
        """The compiled ranges per thread and how many the trace left unclosed (``timeline.compiled``)."""
        from proflab.analysis.timeline.compiled import region_spans

        return region_spans(self.trace)

    @_table
    def inference(self):
        """The generation loop's forwards, phases, latency and bandwidth (see ``timeline.inference``)."""
        from proflab.analysis.timeline.inference import Inference, inference_view

        if self.part_digest is not None:  # a generation's forwards would be cut at the parts' seams
            return Inference(pl.DataFrame(), missing=("a trace read in parts: the generation loop is not analysed",))
        # (its kernels from the trace: the kernel rows are freed)
        return inference_view(self.trace, self.launches, regions=self.regions[0], blocking=self.blocking)

    @property
    def has_launch_links(self) -> bool:
        """Whether host launch calls carry correlation ids that match GPU work."""
        return self.launches.height > 0

    # -- kernels, copies, launches ----------------------------------------------------------
    @_table
    def kernel_rows(self) -> pl.DataFrame:
        return _kernels.kernel_rows(self.trace, self.launches)

    @_table
    def kernel_ops(self) -> pl.DataFrame:
        """The operator (``op``) behind each kernel correlation id that has one."""
        return self.kernel_rows.select("correlation", "op").unique("correlation").drop_nulls("op")

    @_table
    def fp32_gemms(self) -> pl.DataFrame:
        """Kernel rows of FP32 GEMMs that ran without tensor cores (see ``kernels.fp32_gemm_rows``)."""
        return _kernels.fp32_gemm_rows(self.kernel_rows)

    @_table
    def kernel_time_by_name(self) -> pl.DataFrame:
        """Each kernel name's summed duration and launches (``name``, ``dur_ns``, ``count``): what
        rules that weigh kernels by name read once the kernel rows are freed (``report.assemble``)."""
        return self.kernel_rows.group_by("name").agg(pl.col("dur_ns").sum(), pl.len().alias("count"))

    @_table
    def kernel_time_ns(self) -> int:
        """All kernels' summed duration (ns)."""
        return int(self.kernel_rows.get_column("dur_ns").sum())

    def hot_kernels(self, top: int | None = 20) -> pl.DataFrame:
        return self._hot_kernels.head(top) if top is not None else self._hot_kernels

    @_table
    def _hot_kernels(self) -> pl.DataFrame:
        if self.part_digest is not None:
            from proflab.analysis.quantiles import sketch

            rows = self.kernel_rows
            self.part_digest["kernel_ns"] = sketch(rows["dur_ns"], rows["name"]) if rows.height else None
            self.part_digest["kernel_modes"] = _kernels.mode_counts(rows)
        return _kernels.hot_kernels(self.trace, self.kernel_rows, self.frames)

    @_table
    def memcpy_table(self) -> pl.DataFrame:
        return _memcpy.memcpy_table(self.trace)

    @_table
    def range_table(self) -> pl.DataFrame:
        """GPU time of the work launched inside each user/NVTX range name, per device."""
        return _ranges.range_projection(self.trace, self.launches)

    @_table
    def pinning(self) -> tuple[int, list[dict], bool]:
        """What pinning the pageable host copies would save (see ``memcpy.pinning_savings``)."""
        return _memcpy.pinning_savings(self.trace, self.device_info.get("compute_major"))

    @_table
    def launch_stats(self) -> _launch.LaunchStats:
        samples = _launch.launch_samples(self.trace, self.kernel_rows)
        if self.part_digest is not None:
            self.part_digest["launch"] = _launch.digest(samples, self.trace.steps.height)
        return _launch.stats_of(samples)

    @_table
    def device_info(self) -> dict:
        d = self.trace.devices
        active = list(self.device_sets) or [None]
        row = d.filter(pl.col("device") == active[0]) if active[0] is not None else d.head(1)
        if row.height == 0:
            row = d.head(1)
        return row.to_dicts()[0] if row.height else {}


def tokens_as_steps(ctx: Context) -> Context:
    """A context whose trace has no profiler steps but a generation loop: the same trace with its
    forwards as its steps, a token a step (``timeline.inference.token_steps``), so the step
    table, the observer model and the what-if replay run per token. Any other context as it is."""
    from dataclasses import replace

    if ctx.trace.steps.height or ctx.part_digest is not None or ctx._starts_at is not None:
        return ctx
    inf = ctx.inference
    if not inf.found:
        return ctx
    from proflab.analysis.timeline.inference import token_steps

    new = Context(replace(ctx.trace, steps=token_steps(inf)), bare_step_ms=ctx.bare_step_ms)
    # the view reads no steps: the one found is kept, not built again
    new.__dict__["inference"] = replace(inf, tokens_as_steps=True)
    return new
