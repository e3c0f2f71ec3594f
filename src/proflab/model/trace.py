"""The trace model: a few typed polars tables, integer nanoseconds throughout.

Tables (one row per event, never one Python object per event):

``gpu``      kernels, memcpy and memset executed on a device
``cpu``      host events: operators, annotations, Python frames, CUDA runtime/driver calls
``steps``    profiler steps (``ProfilerStep#N``) as host-side windows
``devices``  device properties as the trace reports them
``comms``    collective calls as the trace describes them (torch.distributed's
             ``record_param_comms``: collective, message sizes, dtype, process group)

Columns and their units are fixed by the ``*_SCHEMA`` dicts below; readers must produce
exactly these columns (``Trace.__post_init__`` checks), filling what the input lacks with null.
Missing is not zero: a null ``bytes`` means the input did not say.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

GPU_KINDS = ["kernel", "memcpy", "memset"]
COPY_KINDS = ["HtoD", "DtoH", "DtoD", "HtoH", "PtoP", "unknown"]
MEMORY_KINDS = ["Pageable", "Pinned", "Device", "Managed", "Array", "unknown"]
CPU_CATS = [
    "cpu_op",
    "user_annotation",  # torch record_function / NVTX ranges
    "python_function",
    "cuda_runtime",
    "cuda_driver",
    "gpu_user_annotation",
    "os_runtime",  # OS calls traced by Nsight Systems (poll, read, pthread_cond_wait...)
]

# Kernels of collective-communication libraries (NCCL, RCCL, PyTorch's custom all-reduce).
COMM_KERNEL_PATTERN = r"(?i)nccl|rccl|cross_device_reduce|one_shot_all_reduce|two_shot_all_reduce|multimem_all"

GPU_SCHEMA: dict[str, pl.DataType] = {
    "kind": pl.Enum(GPU_KINDS),
    "name": pl.String,
    "device": pl.Int32,
    "stream": pl.Int64,
    "start_ns": pl.Int64,
    "dur_ns": pl.Int64,
    "correlation": pl.Int64,
    "external_id": pl.Int64,
    "bytes": pl.Int64,  # memcpy / memset payload; null for kernels
    "copy_kind": pl.Enum(COPY_KINDS),  # null unless kind == memcpy
    "src_kind": pl.Enum(MEMORY_KINDS),
    "dst_kind": pl.Enum(MEMORY_KINDS),
    "grid_x": pl.Int32,
    "grid_y": pl.Int32,
    "grid_z": pl.Int32,
    "block_x": pl.Int32,
    "block_y": pl.Int32,
    "block_z": pl.Int32,
    "registers": pl.Int32,  # registers per thread
    "shared_mem_bytes": pl.Int64,  # static + dynamic shared memory per block
    "is_comm": pl.Boolean,  # NCCL or another collective library kernel
}

CPU_SCHEMA: dict[str, pl.DataType] = {
    "cat": pl.Enum(CPU_CATS),
    "name": pl.String,
    "pid": pl.Int64,
    "tid": pl.Int64,
    "start_ns": pl.Int64,
    "dur_ns": pl.Int64,
    "external_id": pl.Int64,
    "correlation": pl.Int64,  # runtime/driver calls: links to the GPU work they launched
    "python_id": pl.Int64,  # python_function frames only
    "python_parent_id": pl.Int64,
    "sequence": pl.Int64,  # autograd sequence number: ties a backward node to its forward op
    # The shapes of a cpu_op recorded with record_shapes, as text. Categorical: a model's
    # operators repeat a few hundred distinct values over a million rows (the 514 MB benchmark
    # trace: 79, 172 and 166), and codes take 4 bytes a row against a string view's 16 and
    # its text (85 -> 15 MiB for the three); cast to pl.String before a ``.str`` expression.
    "input_types": pl.Categorical(),  # dtypes joined by ","
    "input_dims": pl.Categorical(),  # its "Input Dims" as compact JSON
    # (PyTorch 2.4+) its "Concrete Inputs" (the scalar and list arguments as text: a
    # convolution's stride, an attention's is_causal) as compact JSON
    "input_concrete": pl.Categorical(),
}

STEP_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
}

DEVICE_SCHEMA: dict[str, pl.DataType] = {
    "device": pl.Int32,
    "name": pl.String,
    "sm_count": pl.Int32,
    "compute_major": pl.Int32,
    "compute_minor": pl.Int32,
    "total_memory_bytes": pl.Int64,
    "max_threads_per_sm": pl.Int32,
    "regs_per_sm": pl.Int32,
    "shared_mem_per_sm_bytes": pl.Int64,
}


# One row per collective call the host made (``record_param_comms``), keyed by the external
# id its GPU kernel carries too. Element counts, not bytes: bytes need the dtype's size.
COMM_SCHEMA: dict[str, pl.DataType] = {
    "external_id": pl.Int64,
    "start_ns": pl.Int64,  # the host call
    "tid": pl.Int64,
    "collective": pl.String,  # "allreduce", "allgather", "reduce_scatter", "broadcast", ...
    "in_nelems": pl.Int64,
    "out_nelems": pl.Int64,
    "dtype": pl.String,  # as torch names it: "Float", "BFloat16", ...
    "group": pl.String,  # process group name
    "group_size": pl.Int32,
}


@dataclass(frozen=True)
class NextWork:
    """The first GPU work of the part after a part of a trace analysed in parts, on one
    device: its start and the host call that launched it (ns; None where not traced)."""

    device: int
    start_ns: int
    launch_start_ns: int | None = None
    launch_end_ns: int | None = None
    tid: int | None = None
    launch_name: str | None = None


@dataclass(frozen=True)
class TraceMeta:
    """Where a trace came from. ``notes`` are reader remarks worth showing the user."""

    source: str
    format: str  # "kineto"
    format_version: str | None = None
    size_bytes: int | None = None
    event_count: int = 0
    base_time_ns: int | None = None
    with_stack: bool | None = None
    record_shapes: bool | None = None
    profile_memory: bool | None = None  # Kineto: allocations recorded ([memory] events)
    distributed: dict[str, Any] | None = None
    versions: dict[str, str] = field(default_factory=dict)  # tool versions the trace records
    notes: tuple[str, ...] = field(default_factory=tuple)
    budget: int | None = None  # bytes: the memory budget the reader read a part for (None: read as asked)
    # A part of a trace analysed in parts (``report.combine``): per device, the next part's
    # first GPU work and its launch. The part's span reaches to it, its last step ends there
    # on the GPU side, and the idle gap before it has its cause, as in the whole trace.
    next_part_work: tuple[NextWork, ...] = ()


@dataclass(frozen=True)
class Trace:
    """One profiled process: typed tables plus where they came from."""

    gpu: pl.DataFrame
    cpu: pl.DataFrame
    steps: pl.DataFrame
    devices: pl.DataFrame
    meta: TraceMeta
    comms: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=COMM_SCHEMA))
    # A part of a trace analysed in parts (``report.combine``), but the last: the next part's
    # host events (as ``cpu``) from this part's end to the launch of the next part's first
    # work. The idle gap that work ends is this part's, and what the host did in it, this.
    next_part_host: pl.DataFrame | None = None

    def __post_init__(self) -> None:
        for name, schema in (
            ("gpu", GPU_SCHEMA),
            ("cpu", CPU_SCHEMA),
            ("steps", STEP_SCHEMA),
            ("devices", DEVICE_SCHEMA),
            ("comms", COMM_SCHEMA),
        ):
            got = dict(getattr(self, name).schema)
            if got != schema:
                raise TypeError(f"Trace.{name} schema mismatch: {got} != {schema}")

    @property
    def has_gpu(self) -> bool:
        return self.gpu.height > 0

    @property
    def kernels(self) -> pl.DataFrame:
        return self.gpu.filter(pl.col("kind") == "kernel")

    @property
    def memcpy(self) -> pl.DataFrame:
        return self.gpu.filter(pl.col("kind") == "memcpy")

    @property
    def window_ns(self) -> tuple[int, int]:
        """The analysed span: the profiler steps if any, widened to cover all GPU work."""
        gpu_end = (self.gpu["start_ns"] + self.gpu["dur_ns"]).max()
        if self.steps.height:
            starts = [self.steps["start_ns"].min(), self.gpu["start_ns"].min()]
            ends = [self.steps["end_ns"].max(), gpu_end]
        else:
            starts = [self.cpu["start_ns"].min(), self.gpu["start_ns"].min()]
            ends = [(self.cpu["start_ns"] + self.cpu["dur_ns"]).max(), gpu_end]
        starts = [t for t in starts if t is not None]
        ends = [t for t in ends if t is not None]
        if not starts:
            return 0, 0
        return int(min(starts)), int(max(ends))

    def __repr__(self) -> str:
        return (
            f"Trace({self.meta.source!r}, gpu={self.gpu.height} events, cpu={self.cpu.height} events, "
            f"steps={self.steps.height}, devices={self.devices.height})"
        )


def empty(schema: dict[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame(schema=schema)


# GPU columns that count or measure (bytes, launch dimensions, registers): a negative value is
# a damaged input's, and reads as missing, never as a negative size in a report
_COUNTS = ("bytes", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers", "shared_mem_bytes")


def counts_only(gpu: pl.DataFrame) -> pl.DataFrame:
    """``gpu`` (a reader's GPU rows) with negative sizes and launch dimensions as nulls."""
    return gpu.with_columns(count_only(c) for c in _COUNTS if c in gpu.columns)


def count_only(column: str) -> pl.Expr:
    """A GPU column as ``counts_only`` keeps it: null where negative, for a column of ``_COUNTS``."""
    return pl.when(pl.col(column) >= 0).then(pl.col(column)).alias(column) if column in _COUNTS else pl.col(column)


def steps_from_annotations(cpu: pl.DataFrame) -> pl.DataFrame:
    """Profiler steps from ``ProfilerStep#N`` ranges (torch.profiler writes them; in an Nsight
    Systems export they are NVTX ranges when torch.profiler ran too). Host ranges, whatever
    their category (``user_annotation``; ``cpu_op``, which is how PyTorch 1.8-1.13's
    ``Operator`` category is read); the GPU-side copies (``gpu_user_annotation``) only when the
    host has none."""
    marked = cpu.filter(pl.col("name").str.starts_with("ProfilerStep#"))
    host = marked.filter(pl.col("cat").is_in(["user_annotation", "cpu_op"]))
    if host.height == 0:
        host = marked.filter(pl.col("cat") == "gpu_user_annotation")
    steps = (
        host.select(
            pl.col("name").str.extract(r"^ProfilerStep#(\d+)$").cast(pl.Int64).alias("step"),
            pl.col("start_ns"),
            (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"),
        )
        .drop_nulls("step")
        .unique("step", keep="first")
        .sort("start_ns")
    )
    return steps.select(list(STEP_SCHEMA)).cast(STEP_SCHEMA)
