"""Record planted workloads live with torch.profiler on this GPU and diagnose them.

The committed traces prove the rules on one recording; these prove them again on a fresh
one, with whatever torch and driver the GPU machine has today.
"""

from __future__ import annotations

import pytest

import proflab

pytestmark = pytest.mark.gpu

CASES = [
    ("pageable_h2d", "pageable_memcpy"),
    ("sync_every_step", "sync_bound"),
    ("tiny_kernels", "launch_bound"),
    ("starved_input", "host_bound"),
    ("fp32_matmul_no_tf32", "tensor_cores_unused"),
    ("healthy_bf16_gemm", "healthy"),
]


@pytest.mark.parametrize(("workload", "expected"), CASES)
def test_live_recording_top_finding(recorder, tmp_path, workload, expected):
    path = getattr(recorder, workload)(str(tmp_path))
    report = proflab.analyze(proflab.load(path))
    summary = [(f.category, f.severity, round(f.est_gain_ms, 2)) for f in report.findings]
    if expected == "healthy":
        # info-level findings may rank above it; nothing may reach warning
        assert report.findings[-1].category == "healthy", summary
        assert not [f for f in report.findings if f.severity in ("warning", "critical")], summary
    else:
        top = report.findings[0]
        assert top.category == expected, summary
        assert top.est_gain_ms > 0 and top.severity in ("warning", "critical"), summary
