"""Hot kernels: which kernels own the GPU time, and who launched them.

Tensor-core use is read from the kernel name (cuBLAS/cuDNN/CUTLASS name their tiles after
the instruction and data type: ``nvjet``, ``hmma``, ``tf32``, ``s16816``; FP32 SIMT tiles say
``sgemm`` or ``ffma``) and, when the trace has ``record_shapes``, from the dtypes of the
operator that launched the kernel (bf16/fp16 GEMMs use tensor cores). Name-based detection is
a heuristic and is reported as such.
"""

from __future__ import annotations

import polars as pl

from proflab.analysis.labels import kernel_label
from proflab.analysis.timeline.source import FrameIndex
from proflab.model import Trace

__all__ = ["NOT_KERNEL_COLUMNS", "kernel_rows", "fp32_gemm_rows", "hot_kernels", "combined_hot_kernels", "mode_counts", "kernel_label", "TENSOR_CORE_PATTERN", "GEMM_PATTERN", "FP32_SIMT_PATTERN"]

# Kernels that run on tensor cores: MMA tile names, reduced-precision GEMM/conv, attention.
TENSOR_CORE_PATTERN = (
    r"(?i)tf32|bf16|fp16|f16f16|bf16bf16|e4m3|e5m2|hmma|imma|wgmma|gmma|tensorop|"
    r"s1688|s16816|h1688|h16816|i8816|16816|1688gemm|nvjet|_hsh|_bsb|flash|fmha|sdpa|cudnn.*(?:hmma|h884|h1688)"
)
# GEMM-like kernels (cuBLAS, cuBLASLt, CUTLASS, cuDNN implicit GEMM).
# GPU table columns that only copies and memsets fill
NOT_KERNEL_COLUMNS = ("kind", "bytes", "copy_kind", "src_kind", "dst_kind")
GEMM_PATTERN = r"(?i)gemm|gemv|nvjet|cutlass|xmma|matmul|sgemm|dgemm|hgemm"
# FP32 GEMMs on the CUDA cores (no TF32): SIMT sgemm tiles and fp32-only xmma/nvjet tiles.
FP32_SIMT_PATTERN = r"(?i)sgemm|simt.*gemm|gemm.*simt|gemv.*float|gemvx?.*<float|f32f32_f32f32_f32|gemm.*_ffma_|gemmSN.*float"
GEMM_OPS = r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|addbmm|_addmm_activation|conv\w*|cudnn_convolution\w*|convolution\w*|_convolution)$"


def kernel_rows(trace: Trace, launches: pl.DataFrame) -> pl.DataFrame:
    """Kernels joined to the host call that launched them and the operator it ran under."""
    # the copy columns are null for kernels: leave them out of a table as long as the kernels
    k = trace.gpu.drop(NOT_KERNEL_COLUMNS).filter(trace.gpu["kind"] == "kernel")
    k = k.join(launches, on="correlation", how="left")
    # only the operators that launched a kernel: deduplicating every operator's text first
    # cost 0.9 s of 1.0 s here on a 1.5 M event trace
    ids = k.get_column("external_id").drop_nulls().unique().implode()
    ops = (
        trace.cpu.select("cat", "external_id", "name", "input_types")
        .filter(pl.col("external_id").is_in(ids) & pl.col("cat").is_in(["cpu_op", "user_annotation"]))
        .select("external_id", pl.col("name").alias("op"), pl.col("input_types").cast(pl.String).alias("op_input_types"))
        .unique("external_id", keep="first")
    )
    if ops.height:
        k = k.join(ops, on="external_id", how="left")
    else:  # no operators (an Nsight Systems export): broadcast nulls, not a column of them per kernel
        k = k.with_columns(pl.lit(None, dtype=ops.schema[c]).alias(c) for c in ops.columns if c != "external_id")
    # the name patterns once per distinct kernel name (a few hundred), not per kernel (millions
    # of ~175-byte names on a large export)
    names = k.select(pl.col("name").unique()).with_columns(
        pl.col("name").str.contains(GEMM_PATTERN).alias("_gemm_by_name"),
        pl.col("name").str.contains(TENSOR_CORE_PATTERN).alias("tc_by_name"),
        pl.col("name").str.contains(FP32_SIMT_PATTERN).alias("fp32_simt_by_name"),
    )
    k = k.join(names, on="name", how="left", nulls_equal=True, maintain_order="left")
    return k.with_columns(
        pl.col("_gemm_by_name").or_(pl.col("op").fill_null("").str.contains(GEMM_OPS)).alias("is_gemm"),
        pl.col("op_input_types").fill_null("").str.contains(r"(?:^|,)float(?:,|$)").alias("op_fp32"),
        pl.col("op_input_types").fill_null("").str.contains(r"BFloat16|Half|Float8").alias("op_lowp"),
    ).with_columns(
        # Reduced-precision GEMMs run on tensor cores on every GPU since Volta.
        (pl.col("tc_by_name") | (pl.col("is_gemm") & pl.col("op_lowp"))).alias("tensor_cores"),
    ).select(pl.exclude(*_FLAGS, "_gemm_by_name"), *_FLAGS)


_FLAGS = ("is_gemm", "tc_by_name", "fp32_simt_by_name", "op_fp32", "op_lowp", "tensor_cores")


def fp32_gemm_rows(rows: pl.DataFrame) -> pl.DataFrame:
    """The kernel rows of GEMMs with no tensor-core tile in their name that are FP32 by
    name or by their operator's input dtypes: matmuls TF32 or BF16 would move to tensor cores.
    Only the columns the tensor-core rule reads: the report keeps these rows while the rules
    run, and all the kernel rows' columns cost 75 MiB for 328 k FP32 GEMMs."""
    fp32 = pl.col("is_gemm") & ~pl.col("tc_by_name") & (pl.col("fp32_simt_by_name") | pl.col("op_fp32"))
    return rows.lazy().filter(fp32).select(_FP32_GEMM_COLUMNS).collect()


# what ``rules.tensor_cores`` reads of the FP32 GEMM rows
_FP32_GEMM_COLUMNS = ("name", "op", "dur_ns", "fp32_simt_by_name", "op_fp32", "tid", "launch_start_ns")


def _dims_modes(dims: str) -> pl.Expr:
    """The most frequent launch dims (all of them on a tie) of a kernel name's launches, as
    (x, y, z) structs; formatted as text per name afterwards (``_dims_text``), not per launch:
    text per launch cost ~200 MiB of transients for 1.9 M kernels."""
    xyz = [pl.col(f"{dims}_{axis}") for axis in "xyz"]
    return pl.struct(xyz).filter(pl.all_horizontal(c.is_not_null() for c in xyz)).mode().alias(dims)


def _dims_text(dims: str) -> pl.Expr:
    """"XxYxZ" of the modes ``_dims_modes`` kept: the first in text order on a tie."""
    text = pl.format("{}x{}x{}", *(pl.element().struct.field(f"{dims}_{axis}") for axis in "xyz"))
    return pl.col(dims).list.eval(text).list.sort().list.first().alias(dims)


def launch_sources(trace: Trace, frames: FrameIndex, launches: pl.DataFrame) -> pl.Series:
    """The user line behind each launch (rows with ``tid`` and ``launch_start_ns``).

    Backward kernels run on autograd's thread, which has no Python frames: for those the
    line is the forward call that created the autograd node (matched by sequence number),
    marked "(backward)"."""
    direct = frames.lookup(launches.select("tid", pl.col("launch_start_ns").alias("t_ns")))
    if direct.null_count() == 0:
        return direct
    ops = trace.cpu.select("cat", "name", "tid", "start_ns", "dur_ns", "sequence").filter(
        (pl.col("cat") == "cpu_op") & pl.col("sequence").is_not_null()
    )
    nodes = ops.filter(pl.col("name").str.starts_with("autograd::engine::evaluate_function")).select(
        "tid", pl.col("start_ns").alias("node_start"), (pl.col("start_ns") + pl.col("dur_ns")).alias("node_end"), "sequence"
    ).sort("node_start")
    forward = (
        ops.filter(~pl.col("name").str.contains(r"Backward|^autograd::"))
        .sort("start_ns")
        .unique("sequence", keep="first")
        .select("sequence", pl.col("tid").alias("fwd_tid"), pl.col("start_ns").alias("fwd_ns"))
    )
    pts = (
        launches.select(pl.col("tid"), pl.col("launch_start_ns").alias("t"))
        .with_row_index("_i")
        .sort("t")
        .join_asof(nodes, left_on="t", right_on="node_start", by="tid", check_sortedness=False)
        .with_columns(pl.when(pl.col("node_end") >= pl.col("t")).then(pl.col("sequence")).alias("sequence"))
        .join(forward, on="sequence", how="left")
        .sort("_i")
    )
    back = frames.lookup(pts.select(pl.col("fwd_tid").alias("tid"), pl.col("fwd_ns").alias("t_ns")))
    back = pl.select(pl.when(back.is_not_null()).then(pl.concat_str([back, pl.lit(" (backward)")]))).to_series()
    return direct.fill_null(back)


def hot_kernels(
    trace: Trace, rows: pl.DataFrame, frames: FrameIndex, *, top: int | None = None, source_top: int = 30
) -> pl.DataFrame:
    """Kernels grouped by name, sorted by total time (ns), with share of all kernel time (%).

    ``source`` (the user line that launched it; needs with_stack) is looked up for the first
    ``source_top`` kernels only: the walk up the Python stack is per launch."""
    if rows.height == 0:
        return pl.DataFrame()
    total = rows["dur_ns"].sum() or 1
    table = (
        rows.group_by("name")
        .agg(
            pl.len().alias("count"),
            pl.col("dur_ns").sum().alias("total_ns"),
            pl.col("dur_ns").mean().alias("mean_ns"),
            pl.col("dur_ns").median().alias("median_ns"),
            pl.col("dur_ns").max().alias("max_ns"),
            pl.col("device").unique().sort().alias("devices"),
            _dims_modes("grid"),
            _dims_modes("block"),
            pl.col("registers").max().alias("registers"),
            pl.col("shared_mem_bytes").max().alias("shared_mem_bytes"),
            pl.col("op").drop_nulls().mode().sort().first().alias("op"),
            pl.col("is_comm").first(),
            pl.col("is_gemm").first(),
            pl.col("tensor_cores").first(),
            pl.col("fp32_simt_by_name").first(),
            pl.col("op_fp32").any(),
        )
        .with_columns((100.0 * pl.col("total_ns") / total).alias("share_pct"), _dims_text("grid"), _dims_text("block"))
        .sort("total_ns", "name", descending=[True, False])
    )
    if top is not None:
        table = table.head(top)
    if source_top and frames:
        names = table["name"].head(source_top).implode()
        launches = rows.filter(pl.col("name").is_in(names) & pl.col("tid").is_not_null())
        if launches.height:
            lines = (
                launches.select("name")
                .with_columns(launch_sources(trace, frames, launches).alias("source"))
                .drop_nulls("source")
                .group_by("name")
                .agg(pl.col("source").mode().sort().first())
            )
            table = table.join(lines, on="name", how="left")
    if "source" not in table.columns:
        table = table.with_columns(pl.lit(None, dtype=pl.String).alias("source"))
    return table


def mode_counts(rows: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """Per kernel name, how often each launch dims and operator occurs (``grid``, ``block``,
    ``op``: ``name``, the value's columns, ``n``): the parts of a trace analysed in parts add
    them up for the modes :func:`hot_kernels` takes."""
    out = {}
    for dims in ("grid", "block"):
        xyz = [f"{dims}_{axis}" for axis in "xyz"]
        out[dims] = rows.drop_nulls(xyz).group_by("name", *xyz).agg(pl.len().cast(pl.Int64).alias("n"))
    out["op"] = rows.drop_nulls("op").group_by("name", "op").agg(pl.len().cast(pl.Int64).alias("n"))
    return out


def _combined_modes(parts: list[dict[str, pl.DataFrame]]) -> pl.DataFrame:
    """The modes :func:`hot_kernels` takes (``grid``, ``block`` as "XxYxZ", ``op``; the first
    in text order on a tie) from the parts' :func:`mode_counts`."""
    out = None
    for what in ("grid", "block", "op"):
        got = [p[what] for p in parts if p[what].height]
        if not got:
            continue
        keys = [c for c in got[0].columns if c not in ("name", "n")]
        t = pl.concat(got, how="vertical_relaxed").group_by("name", *keys).agg(pl.col("n").sum())
        text = pl.format("{}x{}x{}", *keys) if what != "op" else pl.col("op")
        m = (t.filter(pl.col("n") == pl.col("n").max().over("name")).select("name", text.alias(what))
             .group_by("name").agg(pl.col(what).sort().first()))
        out = m if out is None else out.join(m, on="name", how="full", coalesce=True)
    return out if out is not None else pl.DataFrame(schema={"name": pl.String})


def combined_hot_kernels(tables: list[pl.DataFrame], durations: pl.DataFrame | None, top: int | None,
                         modes: list[dict[str, pl.DataFrame]] | None = None) -> pl.DataFrame:
    """:func:`hot_kernels` of a trace analysed in parts, from each part's whole table, the
    value counts of its kernels' durations by name (``analysis.quantiles``) and of their
    launch dims and operators (:func:`mode_counts`): counts, total, mean and max time, modes
    exact; the median within ``quantiles.ALPHA``; source and flags those of the part with the
    most launches of the kernel (registers and shared memory: the most)."""
    from proflab.analysis.quantiles import by_key

    tables = [t for t in tables if t.height]
    if not tables:
        return pl.DataFrame()
    t = pl.concat(tables, how="diagonal_relaxed").sort("count", descending=True, maintain_order=True)
    out = (
        t.group_by("name", maintain_order=True)
        .agg(
            pl.col("count").sum(),
            pl.col("total_ns").sum(),
            pl.col("max_ns").max(),
            pl.col("devices").explode().drop_nulls().unique().sort(),
            pl.col("grid").first(),
            pl.col("block").first(),
            pl.col("registers").max(),
            pl.col("shared_mem_bytes").max(),
            pl.col("op").drop_nulls().first(),
            pl.col("is_comm").first(),
            pl.col("is_gemm").first(),
            pl.col("tensor_cores").first(),
            pl.col("fp32_simt_by_name").first(),
            pl.col("op_fp32").any(),
            pl.col("source").drop_nulls().first(),
        )
    )
    if modes:
        found = _combined_modes(modes)
        out = out.drop(*(c for c in ("grid", "block", "op") if c in found.columns)).join(found, on="name", how="left", maintain_order="left")
    total = out["total_ns"].sum() or 1
    out = out.with_columns(
        (pl.col("total_ns") / pl.col("count")).alias("mean_ns"), (100.0 * pl.col("total_ns") / total).alias("share_pct")
    ).sort("total_ns", "name", descending=[True, False])
    if top is not None:
        out = out.head(top)
    medians = pl.DataFrame(schema={"key": pl.String, "value": pl.Float64})
    if durations is not None and durations.height:
        medians = by_key(durations.filter(pl.col("key").is_in(out["name"].implode())), 0.5)
    return out.join(medians.rename({"key": "name", "value": "median_ns"}), on="name", how="left", maintain_order="left")
