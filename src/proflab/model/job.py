"""A job: the traces of one distributed program, one per rank (no I/O here).

A rank is known from the trace's ``distributedInfo`` (``rank``, ``world_size``), else from a
``rank<R>`` in its file name (``proflab run`` names torchrun workers' traces so). The traces
are kept as given: a :class:`Trace` per rank; cross-rank analyses live in ``analysis.ranks``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from proflab.errors import UsageError
from proflab.model.trace import Trace

__all__ = ["Job", "rank_of", "world_of"]

_RANK_IN_NAME = re.compile(r"(?:^|[_\-.])rank[_\-]?(\d+)(?:[_\-.]|$)", re.I)


def rank_of(meta_distributed: dict | None, source: str) -> int | None:
    """The rank a trace belongs to: ``distributedInfo.rank``, else ``rank<R>`` in its name."""
    d = meta_distributed or {}
    r = d.get("rank")
    if type(r) is int and r >= 0:
        return r
    m = _RANK_IN_NAME.search(Path(source).name)
    return int(m.group(1)) if m else None


def world_of(meta_distributed: dict | None) -> int | None:
    w = (meta_distributed or {}).get("world_size")
    return w if type(w) is int and w > 0 else None


@dataclass(frozen=True)
class Job:
    """The traces of one job, ordered by rank. ``world_size`` is what the traces declare
    (None when they do not); ``len(ranks)`` may be less: ranks without a trace."""

    ranks: tuple[int, ...]
    traces: tuple[Trace, ...]
    world_size: int | None

    @classmethod
    def of(cls, traces: list[Trace]) -> Job:
        """A job from one trace per rank; raises UsageError when ranks are unknown or repeated."""
        ranks = [rank_of(t.meta.distributed, t.meta.source) for t in traces]
        return cls.from_ranks(ranks, traces, [world_of(t.meta.distributed) for t in traces])

    @classmethod
    def from_ranks(cls, ranks: list[int | None], items: list, worlds: list[int | None]):
        check_ranks(ranks, [getattr(getattr(t, "meta", None), "source", str(t)) for t in items])
        order = sorted(range(len(ranks)), key=lambda i: ranks[i])
        known = {w for w in worlds if w is not None}
        return cls(tuple(ranks[i] for i in order), tuple(items[i] for i in order), max(known) if known else None)

    def __len__(self) -> int:
        return len(self.ranks)


def check_ranks(ranks: list[int | None], sources: list[str]) -> None:
    """Every trace of a job must name its rank, once."""
    for r, s in zip(ranks, sources):
        if r is None:
            raise UsageError(f"{s}: not a rank of a distributed job (no distributedInfo.rank, no rank<R> in its name)")
    seen: dict[int, str] = {}
    for r, s in zip(ranks, sources):
        if r in seen:
            raise UsageError(f"{s}: rank {r} again (also {seen[r]}); pass one trace per rank")
        seen[r] = s


def split_processes(trace: Trace) -> list[tuple[int, Trace]]:
    """The processes of a trace that holds several (an Nsight Systems export of a whole
    torchrun job), each as its own trace, when two or more ran collectives; else []. A GPU
    activity belongs to the process whose host call launched it (correlation), else to the
    process that launched most of its device's work. Returned with each process's GPU index
    (the export does not record ranks: the caller says so)."""
    import polars as pl

    from dataclasses import replace

    if not trace.has_gpu or trace.cpu.height == 0 or not trace.gpu["is_comm"].any():
        return []
    owner = trace.cpu.filter(pl.col("correlation").is_not_null()).select("correlation", "pid").unique("correlation")
    gpu = trace.gpu.join(owner, on="correlation", how="left", maintain_order="left")
    by_device = gpu.drop_nulls("pid").group_by("device").agg(pl.col("pid").mode().first().alias("dev_pid"))
    gpu = gpu.join(by_device, on="device", how="left", maintain_order="left").with_columns(pl.col("pid").fill_null(pl.col("dev_pid")))
    comm_pids = gpu.filter(pl.col("is_comm")).group_by("pid").agg(pl.col("device").mode().first()).drop_nulls().sort("device")
    if comm_pids.height < 2 or comm_pids["device"].n_unique() < comm_pids.height:
        return []
    out = []
    for pid, device in comm_pids.iter_rows():
        g = gpu.filter(pl.col("pid") == pid).drop("pid", "dev_pid")
        c = trace.cpu.filter(pl.col("pid") == pid)
        meta = replace(trace.meta, source=f"{trace.meta.source}#pid{pid}", notes=(*trace.meta.notes, f"process {pid} of a multi-process trace"))
        steps = trace.steps  # ProfilerStep ranges are per process too; keep those inside its host events
        if steps.height and c.height:
            from proflab.model.trace import steps_from_annotations

            steps = steps_from_annotations(c)
        out.append((int(device), Trace(gpu=g, cpu=c, steps=steps, devices=trace.devices, meta=meta, comms=trace.comms)))
    return out
