"""Runtime and driver calls picked by name (``analysis.timeline.calls``): the rows a pattern tested on
every row keeps, with the distinct names found once per host table."""

from __future__ import annotations

import gc

import polars as pl

from proflab.analysis.timeline import calls
from proflab.analysis.timeline.calls import IS_CALL, call_names


def _cpu(rows):
    return pl.DataFrame(rows, schema={"cat": pl.String, "name": pl.String}, orient="row")


def test_the_same_rows_as_the_pattern_on_every_row():
    cpu = _cpu([("cuda_runtime", "cudaMemcpyAsync"), ("cuda_driver", "cuMemcpyAsync"), ("cuda_runtime", None),
                ("cpu_op", "aten::copy_Async"), ("cuda_runtime", "cudaLaunchKernel"), ("cuda_runtime", "cudaMemcpyAsync")])  # fmt: skip
    for pattern in ("Async", "^cuda", "Launch|^cuMemcpy", "nothing"):
        want = cpu.filter(IS_CALL & pl.col("name").str.contains(pattern))
        got = cpu.filter(IS_CALL & pl.col("name").is_in(call_names(cpu, pattern).implode()))
        assert got.equals(want), pattern


def test_distinct_names_found_once_per_table_and_let_go_with_it():
    cpu = _cpu([("cuda_runtime", "a"), ("cuda_runtime", "b")])
    first = calls._distinct(cpu)
    assert calls._distinct(cpu) is first  # asked again: not found again
    other = _cpu([("cuda_runtime", "c")])
    assert call_names(other, ".").to_list() == ["c"]
    key = id(cpu)
    del cpu, first
    gc.collect()
    assert key not in calls._DISTINCT
