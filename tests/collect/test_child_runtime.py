"""The in-process runtime (``_child.py``) driven directly, without a subprocess: the parts
that must hold whatever the profiled program does."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from proflab.collect import _child


def _runtime(tmp_path: Path, pid: int, **cfg) -> _child.Runtime:
    (tmp_path / "traces").mkdir(exist_ok=True)
    rt = _child.Runtime({"run_dir": str(tmp_path), **cfg})
    rt.pid = pid
    return rt


class _FakeProfile:
    """Stands in for torch.profiler.profile: export_chrome_trace writes a small gzip file,
    after running ``during`` (what another process does meanwhile)."""

    def __init__(self, during=None) -> None:
        self.during = during

    def export_chrome_trace(self, path: str) -> None:
        if self.during is not None:
            self.during()
        with gzip.open(path, "wt") as f:
            json.dump({"traceEvents": []}, f)


def test_two_processes_exporting_at_once_both_keep_their_trace(tmp_path):
    # torchrun ranks close their step windows together: while rank 0 writes its trace
    # (Kineto's export takes seconds), rank 1 finishes its own and tidies up.
    r0, r1 = _runtime(tmp_path, 100), _runtime(tmp_path, 101)
    r0._export(_FakeProfile(during=lambda: r1._export(_FakeProfile())))
    assert r0.notes == [] and r1.notes == []
    names = sorted(p.name for p in (tmp_path / "traces").iterdir() if p.is_file())
    assert len(names) == 2 and all(n.endswith(".pt.trace.json.gz") for n in names)
    assert [p.name for p in (tmp_path / "traces").iterdir() if p.name.startswith(".")] == []
