"""Report assembly builds the big tables while little else is held and frees the kernel rows
once the small tables read from them exist (``report.assemble._while_little_is_held``): the
report must not change, and a caller that goes on using the context gets the same tables."""

from __future__ import annotations

import pytest

import proflab
from proflab.analysis.context import Context
from proflab.report import assemble
from proflab.report.assemble import report_for


@pytest.mark.parametrize("name", ["fp32_matmul_no_tf32", "train_loop", "tiny_kernels", "sync_every_step"])
def test_freed_kernel_rows_come_back_the_same_and_the_report_does_not_change(find_trace, name, monkeypatch):
    trace = proflab.load(find_trace(name))
    ctx = Context(trace)
    report = report_for(ctx)
    assert "kernel_rows" not in ctx.__dict__  # freed once its readers had what they need
    fresh = Context(trace)
    assert ctx.kernel_rows.equals(fresh.kernel_rows)  # computed again on use
    # the same report in the order the rules ask for the tables, nothing freed
    monkeypatch.setattr(assemble, "_while_little_is_held", lambda ctx: None)
    as_asked = Context(trace)
    assert report_for(as_asked).to_dict() == report.to_dict()
    assert "kernel_rows" in as_asked.__dict__


def test_the_fp32_gemm_finding_reads_the_small_tables(find_trace):
    """The tensor-core rule reads the FP32 GEMM rows and the kernels' total time, not the
    kernel rows: on the planted FP32 matmul trace it fires, with the kernel rows freed."""
    trace = proflab.load(find_trace("fp32_matmul_no_tf32"))
    ctx = Context(trace)
    found = [f for f in report_for(ctx).findings if f.id == "tensor_cores_unused"]
    assert found and found[0].evidence["fp32_gemm_kernels"] == ctx.fp32_gemms.height > 0
    assert ctx.kernel_time_ns == int(Context(trace).kernel_rows["dur_ns"].sum())
