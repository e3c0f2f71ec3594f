"""Reader for Nsight Systems SQLite exports (schema 3.x) and, through ``nsys export``,
``.nsys-rep`` reports.

What an export holds and how it maps onto the model:

- tables exist only when they have data; names are ids into ``StringIds``;
- ``CUPTI_ACTIVITY_KIND_KERNEL`` / ``_MEMCPY`` / ``_MEMSET`` -> ``gpu`` (copy and memory kinds
  from their enums: pageable, pinned, device, managed...);
- ``CUPTI_ACTIVITY_KIND_RUNTIME`` / ``_DRIVER`` -> ``cpu`` runtime/driver calls (names lose
  their version suffix: ``cudaMemcpyAsync_v3020`` -> ``cudaMemcpyAsync``);
- ``NVTX_EVENTS`` push/pop and start/end ranges -> ``cpu`` annotations, named
  ``domain:range`` outside the default domain (``ProfilerStep#N`` ranges become steps);
  ``OSRT_API`` -> ``cpu`` OS-runtime calls;
- ``TARGET_INFO_GPU`` -> ``devices`` when present.

CUPTI correlation ids are unique only within a process, and an export can hold several: the
model's ``correlation`` is ``pid << 32 | correlationId`` so joins never cross processes.
``globalTid`` packs the process and thread ids (pid in bits 24-47, tid in bits 0-23).
Tables are fetched in batches of rows, so memory follows the tables' size, not SQLite's.
"""

from __future__ import annotations

import dataclasses
import shutil
import sqlite3
import subprocess
import tempfile
from pathlib import Path

import polars as pl

from proflab.errors import CorruptInput, EmptyTrace, SchemaError, UnsupportedFormat
from proflab.model.trace import (
    COMM_KERNEL_PATTERN,
    COPY_KINDS,
    CPU_SCHEMA,
    DEVICE_SCHEMA,
    GPU_SCHEMA,
    MEMORY_KINDS,
    Trace,
    TraceMeta,
    steps_from_annotations,
)

__all__ = ["sniff", "read", "SQLITE_MAGIC"]

SQLITE_MAGIC = b"SQLite format 3\x00"
_BATCH_ROWS = 50_000

# ENUM_CUDA_MEMCPY_OPER and ENUM_CUDA_MEM_KIND ids (stable across nsys versions).
_COPY_KIND = {1: "HtoD", 2: "DtoH", 8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD"}
_MEM_KIND = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device", 6: "Managed"}
_NVTX_RANGES = (59, 60)  # NvtxPushPopRange, NvtxStartEndRange


def sniff(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(16) == SQLITE_MAGIC
    except OSError:
        return False


def read(path: str | Path) -> Trace:
    """Read an export (or convert a ``.nsys-rep`` with nsys first). Raises InputError subclasses."""
    path = Path(path)
    if path.suffix == ".nsys-rep" or (path.exists() and not sniff(path) and _is_nsys_rep(path)):
        return _read_report(path)
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as e:
        raise CorruptInput(path, f"cannot open as SQLite: {e}") from e
    try:
        return _read(path, con)
    except sqlite3.DatabaseError as e:
        raise CorruptInput(path, f"damaged or truncated SQLite database ({e})") from e
    finally:
        con.close()


def _is_nsys_rep(path: Path) -> bool:
    return path.suffix in (".nsys-rep", ".qdrep")


def _read_report(path: Path) -> Trace:
    nsys = shutil.which("nsys")
    if nsys is None:
        raise UnsupportedFormat(
            path,
            "an Nsight Systems report needs nsys to convert it; install Nsight Systems, or run "
            "`nsys export --type sqlite <report>` where it is installed and pass the .sqlite file",
        )
    with tempfile.TemporaryDirectory(prefix="proflab-nsys-") as tmp:
        out = Path(tmp) / (path.stem + ".sqlite")
        done = subprocess.run(
            [nsys, "export", "--type", "sqlite", "--output", str(out), "--force-overwrite", "true", str(path)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0 or not out.exists():
            last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise UnsupportedFormat(path, f"nsys export failed: {last[0]}")
        trace = read(out)
    return Trace(trace.gpu, trace.cpu, trace.steps, trace.devices, _with_source(trace.meta, path))


def _with_source(meta: TraceMeta, path: Path) -> TraceMeta:
    return dataclasses.replace(meta, source=str(path), format="nsys-rep")


def _read(path: Path, con: sqlite3.Connection) -> Trace:
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables:
        raise EmptyTrace(path, "SQLite database with no tables")
    if "StringIds" not in tables and not any(t.startswith(("CUPTI_ACTIVITY_KIND_", "NVTX_")) for t in tables):
        raise UnsupportedFormat(path, "SQLite database, but not an Nsight Systems export (no StringIds or CUPTI tables)")
    ctx = _Ctx(path, con, tables)
    gpu = pl.concat([ctx.kernels(), ctx.memcpy(), ctx.memset()]).sort("start_ns", maintain_order=True)
    cpu = pl.concat([ctx.api("CUPTI_ACTIVITY_KIND_RUNTIME", "cuda_runtime"), ctx.api("CUPTI_ACTIVITY_KIND_DRIVER", "cuda_driver"),
                     ctx.nvtx(), ctx.osrt()]).sort("start_ns", maintain_order=True)  # fmt: skip
    if gpu.height == 0 and cpu.height == 0:
        raise EmptyTrace(path, "Nsight Systems export with no CUDA, NVTX or OS runtime events")
    devices = ctx.devices()
    meta = TraceMeta(
        source=str(path),
        format="nsys-sqlite",
        format_version=ctx.schema_version(),
        size_bytes=path.stat().st_size,
        event_count=gpu.height + cpu.height,
        versions=ctx.versions(),
        notes=tuple(ctx.notes),
    )
    return Trace(gpu=gpu, cpu=cpu, steps=steps_from_annotations(cpu), devices=devices, meta=meta)


class _Ctx:
    def __init__(self, path: Path, con: sqlite3.Connection, tables: set[str]) -> None:
        self.path, self.con, self.tables = path, con, tables
        self.notes: list[str] = []
        self._strings: pl.DataFrame | None = None

    def columns(self, table: str) -> set[str]:
        return {r[1] for r in self.con.execute(f'PRAGMA table_info("{table}")')}

    def need(self, table: str, *cols: str) -> None:
        missing = [c for c in cols if c not in self.columns(table)]
        if missing:
            raise SchemaError(self.path, f"table {table} lacks column(s) {', '.join(missing)} (unsupported export version?)")

    def fetch(self, sql: str, schema: dict[str, pl.DataType], finish=None) -> pl.DataFrame:
        """Rows of ``sql`` in batches; ``finish`` turns each batch into its final columns
        right away, so raw rows and intermediate columns never exist for the whole table."""
        finish = finish or (lambda df: df)
        cur = self.con.execute(sql)
        frames = []
        while rows := cur.fetchmany(_BATCH_ROWS):
            frames.append(finish(pl.DataFrame(rows, schema=schema, orient="row")))
            del rows
        return pl.concat(frames) if frames else finish(pl.DataFrame(schema=schema))

    def named(self, df: pl.DataFrame, id_col: str = "name_id", out: str = "name") -> pl.DataFrame:
        """Replace a StringIds id column by its text: one join, so the text of a repeated
        name is never built once per row."""
        if self._strings is None:
            self._strings = (
                self.fetch("SELECT id, value FROM StringIds", {"id": pl.Int64, "value": pl.String})
                if "StringIds" in self.tables
                else pl.DataFrame(schema={"id": pl.Int64, "value": pl.String})
            )
        joined = df.join(self._strings.rename({"id": id_col, "value": "_text"}), on=id_col, how="left")
        text = pl.coalesce(pl.col(out), pl.col("_text")) if out in df.columns else pl.col("_text")
        return joined.with_columns(text.alias(out)).drop(id_col, "_text")

    # -- GPU ---------------------------------------------------------------------------
    def _gpu_frame(self, df: pl.DataFrame, kind: str) -> pl.DataFrame:
        pid = (pl.col("global_pid") // (1 << 24)) % (1 << 24)
        df = df.with_columns(
            pl.lit(kind).cast(GPU_SCHEMA["kind"]).alias("kind"),
            ((pid * (1 << 32)) + pl.col("correlation")).alias("correlation"),
            pl.lit(None, dtype=pl.Int64).alias("external_id"),
        )
        for col, dtype in GPU_SCHEMA.items():
            if col not in df.columns:
                df = df.with_columns(pl.lit(None, dtype=dtype).alias(col))
        return df.select([pl.col(c).cast(t) for c, t in GPU_SCHEMA.items()])

    def kernels(self) -> pl.DataFrame:
        t = "CUPTI_ACTIVITY_KIND_KERNEL"
        if t not in self.tables:
            return pl.DataFrame(schema=GPU_SCHEMA)
        self.need(t, "start", "end", "deviceId", "streamId", "correlationId", "globalPid", "demangledName")
        cols = self.columns(t)
        shared = " + ".join(c for c in ("staticSharedMemory", "dynamicSharedMemory") if c in cols) or "NULL"
        dims = ", ".join(f"k.{c}" if c in cols else "NULL" for c in ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ"))
        regs = "k.registersPerThread" if "registersPerThread" in cols else "NULL"
        df = self.fetch(
            f"SELECT k.demangledName, k.deviceId, k.streamId, k.start, k.end - k.start, "
            f"k.correlationId, k.globalPid, {dims}, {regs}, {shared} FROM {t} k",
            {"name_id": pl.Int64, "device": pl.Int32, "stream": pl.Int64, "start_ns": pl.Int64, "dur_ns": pl.Int64,
             "correlation": pl.Int64, "global_pid": pl.Int64, "grid_x": pl.Int32, "grid_y": pl.Int32, "grid_z": pl.Int32,
             "block_x": pl.Int32, "block_y": pl.Int32, "block_z": pl.Int32, "registers": pl.Int32,
             "shared_mem_bytes": pl.Int64},
            lambda df: self._gpu_frame(
                self.named(df).with_columns(pl.col("name").str.contains(COMM_KERNEL_PATTERN).fill_null(False).alias("is_comm")),
                "kernel",
            ),
        )  # fmt: skip
        return df

    def memcpy(self) -> pl.DataFrame:
        t = "CUPTI_ACTIVITY_KIND_MEMCPY"
        if t not in self.tables:
            return pl.DataFrame(schema=GPU_SCHEMA)
        self.need(t, "start", "end", "deviceId", "streamId", "correlationId", "globalPid", "bytes", "copyKind", "srcKind", "dstKind")
        df = self.fetch(
            f"SELECT deviceId, streamId, start, end - start, correlationId, globalPid, bytes, copyKind, srcKind, dstKind FROM {t}",
            {"device": pl.Int32, "stream": pl.Int64, "start_ns": pl.Int64, "dur_ns": pl.Int64, "correlation": pl.Int64,
             "global_pid": pl.Int64, "bytes": pl.Int64, "ck": pl.Int64, "sk": pl.Int64, "dk": pl.Int64},
            lambda df: self._gpu_frame(
                df.with_columns(
                    _mapped("ck", _COPY_KIND, COPY_KINDS).alias("copy_kind"),
                    _mapped("sk", _MEM_KIND, MEMORY_KINDS).alias("src_kind"),
                    _mapped("dk", _MEM_KIND, MEMORY_KINDS).alias("dst_kind"),
                    pl.lit(False).alias("is_comm"),
                ).with_columns(
                    # the same names Kineto gives copies, so reports read alike whatever the input
                    pl.format("Memcpy {} ({} -> {})", "copy_kind", "src_kind", "dst_kind").alias("name"),
                ),
                "memcpy",
            ),
        )  # fmt: skip
        return df

    def memset(self) -> pl.DataFrame:
        t = "CUPTI_ACTIVITY_KIND_MEMSET"
        if t not in self.tables:
            return pl.DataFrame(schema=GPU_SCHEMA)
        self.need(t, "start", "end", "deviceId", "streamId", "correlationId", "globalPid", "bytes")
        kind = "memKind" if "memKind" in self.columns(t) else "NULL"
        df = self.fetch(
            f"SELECT deviceId, streamId, start, end - start, correlationId, globalPid, bytes, {kind} FROM {t}",
            {"device": pl.Int32, "stream": pl.Int64, "start_ns": pl.Int64, "dur_ns": pl.Int64, "correlation": pl.Int64,
             "global_pid": pl.Int64, "bytes": pl.Int64, "mk": pl.Int64},
            lambda df: self._gpu_frame(
                df.with_columns(
                    pl.format("Memset ({})", _mapped("mk", _MEM_KIND, MEMORY_KINDS).cast(pl.String).fill_null("unknown"))
                    .alias("name"),
                    pl.lit(False).alias("is_comm"),
                ),
                "memset",
            ),
        )  # fmt: skip
        return df

    # -- host ----------------------------------------------------------------------------
    def _host_frame(self, df: pl.DataFrame, cat: str, *, correlated: bool) -> pl.DataFrame:
        pid = (pl.col("global_tid") // (1 << 24)) % (1 << 24)
        df = df.with_columns(
            pl.lit(cat).cast(CPU_SCHEMA["cat"]).alias("cat"),
            pid.alias("pid"),
            (pl.col("global_tid") % (1 << 24)).alias("tid"),
            ((pid * (1 << 32)) + pl.col("correlation")).alias("correlation") if correlated
            else pl.lit(None, dtype=pl.Int64).alias("correlation"),
        )  # fmt: skip
        for col, dtype in CPU_SCHEMA.items():
            if col not in df.columns:
                df = df.with_columns(pl.lit(None, dtype=dtype).alias(col))
        return df.select([pl.col(c).cast(t) for c, t in CPU_SCHEMA.items()])

    def api(self, table: str, cat: str) -> pl.DataFrame:
        if table not in self.tables:
            return pl.DataFrame(schema=CPU_SCHEMA)
        self.need(table, "start", "end", "globalTid", "correlationId", "nameId")
        df = self.fetch(
            f"SELECT r.nameId, r.globalTid, r.start, r.end - r.start, r.correlationId FROM {table} r",
            {"name_id": pl.Int64, "global_tid": pl.Int64, "start_ns": pl.Int64, "dur_ns": pl.Int64, "correlation": pl.Int64},
            lambda df: self._host_frame(
                self.named(df).with_columns(pl.col("name").str.replace(r"(?:_v\d+)+$", "")), cat, correlated=True
            ),
        )
        return df

    def nvtx(self) -> pl.DataFrame:
        t = "NVTX_EVENTS"
        if t not in self.tables:
            return pl.DataFrame(schema=CPU_SCHEMA)
        self.need(t, "start", "end", "eventType", "text", "textId", "globalTid")
        has_domain = "domainId" in self.columns(t)
        domains = dict(self.con.execute(f"SELECT domainId, text FROM {t} WHERE eventType = 75")) if has_domain else {}
        df = self.fetch(
            f"SELECT n.text, n.textId, {'n.domainId' if has_domain else 'NULL'}, "
            f"n.globalTid, n.start, n.end - n.start FROM {t} n WHERE n.end IS NOT NULL AND n.eventType IN {_NVTX_RANGES}",
            {"name": pl.String, "name_id": pl.Int64, "domain_id": pl.Int64, "global_tid": pl.Int64, "start_ns": pl.Int64,
             "dur_ns": pl.Int64},
            lambda df: self._host_frame(self._nvtx_names(self.named(df), domains), "user_annotation", correlated=False),
        )
        return df

    @staticmethod
    def _nvtx_names(df: pl.DataFrame, domains: dict[int, str]) -> pl.DataFrame:
        if domains:  # ranges of a named domain read "domain:range", as Nsight Systems shows them
            domain = pl.col("domain_id").replace_strict(domains, default=None, return_dtype=pl.String)
            df = df.with_columns(
                pl.when(domain.is_not_null())
                .then(pl.concat_str([domain, pl.lit(":"), pl.col("name").fill_null("")]))
                .otherwise(pl.col("name"))
                .alias("name")
            )
        # torch.autograd.profiler.emit_nvtx names ranges "aten::addmm, seq = 47595, op_id = 999269,
        # sizes = [...]": the operator is the name; the rest would make every range unique.
        return df.with_columns(pl.col("name").fill_null("").str.replace(r", (?:seq|op_id|sizes|input_op_ids) = .*$", ""))

    def osrt(self) -> pl.DataFrame:
        t = "OSRT_API"
        if t not in self.tables:
            return pl.DataFrame(schema=CPU_SCHEMA)
        self.need(t, "start", "end", "globalTid", "nameId")
        df = self.fetch(
            f"SELECT o.nameId, o.globalTid, o.start, o.end - o.start FROM {t} o",
            {"name_id": pl.Int64, "global_tid": pl.Int64, "start_ns": pl.Int64, "dur_ns": pl.Int64},
            lambda df: self._host_frame(self.named(df), "os_runtime", correlated=False),
        )
        return df

    # -- context ------------------------------------------------------------------------
    def devices(self) -> pl.DataFrame:
        t = "TARGET_INFO_GPU"
        if t not in self.tables:
            self.notes.append("the export has no TARGET_INFO_GPU table: device names and properties are unknown")
            return pl.DataFrame(schema=DEVICE_SCHEMA)
        cols = self.columns(t)

        def col(name: str, expr: str | None = None) -> str:
            return (expr or name) if name in cols else "NULL"

        df = self.fetch(
            f"SELECT {col('cuDevice')}, {col('name')}, {col('smCount')}, {col('computeMajor')}, {col('computeMinor')}, "
            f"{col('totalMemory')}, {col('maxWarpsPerSm', 'maxWarpsPerSm * 32')}, {col('maxRegistersPerSm')}, "
            f"{col('maxShmemPerSm')} FROM {t}",
            DEVICE_SCHEMA,
        )
        return df

    def schema_version(self) -> str | None:
        if "META_DATA_EXPORT" not in self.tables:
            return None
        row = self.con.execute("SELECT value FROM META_DATA_EXPORT WHERE name = 'EXPORT_SCHEMA_VERSION'").fetchone()
        return None if row is None else str(row[0])

    def versions(self) -> dict[str, str]:
        out = {}
        if "META_DATA_EXPORT" in self.tables:
            for name, value in self.con.execute(
                "SELECT name, value FROM META_DATA_EXPORT WHERE name IN ('EXPORT_SCHEMA_VERSION', 'EXPORT_PRODUCT_VERSION')"
            ):
                out["nsys_export_schema" if name == "EXPORT_SCHEMA_VERSION" else "nsys"] = str(value)
        return out


def _mapped(col: str, mapping: dict[int, str], values: list[str]) -> pl.Expr:
    return pl.col(col).replace_strict(mapping, default="unknown", return_dtype=pl.String).cast(pl.Enum(values))
