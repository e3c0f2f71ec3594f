"""An Nsight Systems export analysed within a memory budget (``readers.budget``).

The shared exports are small, so the budgets here are set between the fixed part of the
estimate and the whole export's estimate: what a 3.5 GB capture is to 1.5 GB, a 2 MB export
is to a budget a little over the fixed part. The part read is checked against the same part
read by ``--window`` / ``--steps`` (itself checked against slicing the whole read), and the
notes' figures against SQL over the export. Peak RSS under a budget is measured on a
generated export in ``test_nsys_scale.py``."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from proflab.cli import main
from proflab.errors import UsageError
from proflab.readers import budget as limits
from proflab.readers import load, nsys_sqlite
from test_nsys_slicing import with_steps

from shared_fixtures import ABSENT, NSYS  # noqa: E402

H100 = NSYS / "h100_2gpu_1s.sqlite"

needs_nsys = pytest.mark.skipif(not H100.exists(), reason=f"{ABSENT}: no {H100.name}")


def _budget(path: Path, share: float) -> int:
    """A budget that leaves ``share`` of the export's estimated per-event memory room."""
    need = limits.estimate(nsys_sqlite.table_rows(path))
    return int(limits.COST_FIXED + share * (need - limits.COST_FIXED))


def _origin(path: Path) -> int:
    con = sqlite3.connect(path)
    try:
        firsts = [con.execute(f'SELECT min(start) FROM "{t}" WHERE end >= start').fetchone()[0]
                  for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_RUNTIME")]
        firsts.append(con.execute("SELECT min(start) FROM NVTX_EVENTS WHERE end >= start AND eventType IN (59, 60)").fetchone()[0])
    finally:
        con.close()
    return min(f for f in firsts if f is not None)


@needs_nsys
def test_an_export_over_the_budget_is_read_in_a_middle_window_that_fits():
    budget = _budget(H100, 0.5)
    whole = load(H100, cache=False)
    got = load(H100, cache=False, budget=budget)
    assert got.meta.budget == budget and whole.meta.budget is None
    part_note = next(n for n in got.meta.notes if n.startswith("analysed part of the trace: window "))
    window = part_note.removeprefix("analysed part of the trace: window ").split(" (")[0]
    from proflab.model.slicing import parse_window

    same = load(H100, cache=False, part=parse_window(window))  # the same part, asked for by --window
    for table in ("gpu", "cpu", "steps", "devices"):
        assert_frame_equal(getattr(got, table), getattr(same, table))
    kept = got.gpu.height + got.cpu.height
    # the room is 80 % of half the export's per-event estimate: events of about that cost, from
    # the middle by where the cost lies (this export's GPU work is spread evenly over its
    # second; half its host events come in one burst of 20 ms)
    cost = got.gpu.height * limits.COST_GPU + got.cpu.height * limits.COST_HOST
    variable = whole.gpu.height * limits.COST_GPU + whole.cpu.height * limits.COST_HOST
    assert 0.3 * variable < cost < 0.45 * variable
    lo, hi = int(got.cpu["start_ns"].min()), int((got.cpu["start_ns"] + got.cpu["dur_ns"]).max())
    w_lo, w_hi = int(whole.cpu["start_ns"].min()), int((whole.cpu["start_ns"] + whole.cpu["dur_ns"]).max())
    assert lo - w_lo > 0.15 * (w_hi - w_lo) and w_hi - hi > 0.15 * (w_hi - w_lo)  # neither end
    assert got.meta.event_count == whole.meta.event_count
    budget_notes = [n for n in got.meta.notes if n.startswith("memory budget: ")]
    assert len(budget_notes) == 2
    assert f"{kept:,} of its {whole.meta.event_count:,} events" in budget_notes[0]
    assert f"over the budget of {budget / 1e6:.0f} MB" in budget_notes[0]
    # the part's kernel time, as SQL over the export gives it
    origin = _origin(H100)
    a_ms, b_ms = (float(x.removesuffix("ms")) for x in window.split(":"))
    lo_ns, hi_ns = origin + round(a_ms * 1e6), origin + round(b_ms * 1e6)
    con = sqlite3.connect(H100)
    by_kernel = con.execute(
        f"SELECT sum(max(0, min(end, {hi_ns}) - max(start, {lo_ns}))), sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL "
        "GROUP BY demangledName ORDER BY 2 DESC"
    ).fetchall()
    con.close()
    part_ns, whole_ns = sum(p for p, _ in by_kernel), sum(w for _, w in by_kernel)
    assert f"the part runs {part_ns / 1e6:,.1f} ms of kernels" in budget_notes[1]
    assert f"of the export's {whole_ns / 1e6:,.1f} ms" in budget_notes[1]
    points = max(abs(100 * p / part_ns - 100 * w / whole_ns) for p, w in by_kernel[:10])
    # (this one-second export is not alike throughout: a kernel with a tenth of its kernel
    # time runs only before its middle)
    assert points > 5 and "the part is NOT like the whole export: " in budget_notes[1]
    assert f"({points:.1f} points apart)" in budget_notes[1]


@needs_nsys
def test_an_export_within_the_budget_is_read_whole():
    need = limits.estimate(nsys_sqlite.table_rows(H100))
    got = load(H100, cache=False, budget=need)
    whole = load(H100, cache=False)
    assert got.meta.budget is None and got.meta.notes == whole.meta.notes
    assert_frame_equal(got.cpu, whole.cpu)


@needs_nsys
def test_an_export_with_steps_is_read_in_whole_steps_from_its_middle(tmp_path):
    stepped = with_steps(H100, tmp_path / "stepped.sqlite", n=20, first=0)
    got = load(stepped, cache=False, budget=_budget(stepped, 0.5))
    steps = got.steps["step"].to_list()
    assert 4 <= len(steps) <= 12 and steps == list(range(steps[0], steps[-1] + 1))
    assert steps[0] >= 3 and steps[-1] <= 16  # the middle, not either end
    note = next(n for n in got.meta.notes if n.startswith("memory budget: reading"))
    assert f"analysed profiler steps {steps[0]}:{steps[-1] + 1}:" in note
    from proflab.model.slicing import parse_steps

    same = load(stepped, cache=False, part=parse_steps(f"{steps[0]}:{steps[-1] + 1}"))
    assert_frame_equal(got.gpu, same.gpu)
    assert_frame_equal(got.cpu, same.cpu)
    # the 20 steps are of one width: the part's median is the whole export's
    ms = float(((got.steps["end_ns"] - got.steps["start_ns"]) / 1e6).median())
    said = [n for n in got.meta.notes if n.startswith("memory budget: ")]
    assert said[2] == (f"memory budget: the part's {len(steps)} steps take a median of {ms:,.3f} ms (host ranges), "
                       f"the whole export's 20 steps a median of {ms:,.3f} ms")


@pytest.fixture(scope="module")
def alike(tmp_path_factory) -> Path:
    """The one-second export repeated 8 times one after another (``benchmarks/gen_nsys.py``):
    alike throughout, as the steady steps of a long capture are."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from gen_nsys import scale

    out = tmp_path_factory.mktemp("budget") / "alike.sqlite"
    assert scale(H100, out, 12) == 8
    return out


@needs_nsys
def test_a_part_like_the_whole_export_says_how_alike(alike):
    got = load(alike, cache=False, budget=_budget(alike, 0.5))
    note = [n for n in got.meta.notes if n.startswith("memory budget: ")][1]
    points = float(note.split(" points of their shares")[0].rsplit(" ", 1)[1])
    assert "the export's 10 kernels with the most time take shares of kernel time in the part within " in note
    assert points < 2.0


@needs_nsys
def test_a_part_unlike_the_whole_export_is_named(alike, tmp_path):
    """The kernels of the repeated export's first 30 % renamed to one new kernel: the whole
    export's top kernel is then one the middle part does not run, and the note says the part
    is not like the whole, naming it with both shares."""
    odd = tmp_path / "odd.sqlite"
    shutil.copyfile(alike, odd)
    con = sqlite3.connect(odd)
    sid = con.execute("SELECT max(id) FROM StringIds").fetchone()[0] + 1
    con.execute("INSERT INTO StringIds (id, value) VALUES (?, 'warmup_<script>_kernel')", (sid,))
    t0, t1 = con.execute("SELECT min(start), max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET demangledName = ?, shortName = ? WHERE end < ?", (sid, sid, t0 + (t1 - t0) * 0.3))
    con.commit()
    con.close()
    got = load(odd, cache=False, budget=_budget(odd, 0.3))
    note = [n for n in got.meta.notes if n.startswith("memory budget: ")][1]
    assert "the part is NOT like the whole export: warmup_<script>_kernel takes " in note
    part_pct, whole_pct = (float(x.split("%")[0]) for x in note.split(" takes ")[1].split(" time and "))
    assert part_pct == 0.0 and whole_pct > 20
    assert "analyse other parts with --steps / --window" in note


@needs_nsys
def test_a_part_copying_unlike_the_whole_export_is_named(alike, tmp_path):
    """Every kernel of the repeated export's first 30 % made 40 times longer: kernel for kernel
    the shares of kernel time stay alike, but copies take another share of the GPU time where
    those long kernels run (the export is copy-bound: 99 % elsewhere). The middle part's share of
    copies is not the whole export's, and the note says so with both shares, as SQLite sums them."""
    odd = tmp_path / "copying.sqlite"
    shutil.copyfile(alike, odd)
    con = sqlite3.connect(odd)
    t0, t1 = con.execute("SELECT min(start), max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    con.execute('UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = start + 40 * ("end" - start) WHERE "end" < ?', (t0 + (t1 - t0) * 0.3,))
    con.commit()
    got = load(odd, cache=False, budget=_budget(odd, 0.3))
    note = [n for n in got.meta.notes if n.startswith("memory budget: ")][1]
    assert "the part is NOT like the whole export: copies are " in note and "takes" not in note
    part_pct, whole_pct = (float(x) for x in re.findall(r"copies are ([\d.]+)% of its kernel and copy time, ([\d.]+)% of the export's", note)[0])
    lo, hi = got.gpu.select(pl.col("start_ns").min(), (pl.col("start_ns") + pl.col("dur_ns")).max().alias("end_ns")).row(0)
    kern, copy = (con.execute(f"SELECT sum(min(end, {hi}) - max(start, {lo})) FROM {t} WHERE start < {hi} AND end > {lo}").fetchone()[0]
                  for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY"))  # fmt: skip
    con.close()
    points = float(re.findall(r"\(([\d.]+) points apart\)", note)[0])
    assert abs(points - abs(whole_pct - part_pct)) <= 0.11 and points > 5 and abs(part_pct - 100 * copy / (kern + copy)) < 1.0
    assert "analyse other parts with --steps / --window" in note


def test_the_share_of_copies_is_said_beside_alike_kernels():
    """Kernels and copies alike: one note, the kernels within a few points and both shares of
    copies; an export or trace without copies says nothing of them."""
    rows = [("a", 600, 60), ("b", 400, 40)]
    like = limits.kernel_likeness(rows, (1000, 100))
    assert like["copies_whole_pct"] == 50.0 and like["copies_part_pct"] == 50.0 and like["copies_points"] == 0.0
    (note,) = limits._kernels_alike(like, "export")
    assert "within 0.0 points of their shares in the whole export; copies are 50.0% of its kernel and copy time, 50.0% of the export's" in note
    assert "NOT like" not in note
    for copies in (None, (0, 0)):
        (note,) = limits._kernels_alike(limits.kernel_likeness(rows, copies), "trace")
        assert "copies" not in note


@needs_nsys
def test_the_cli_takes_a_budget_and_says_what_it_read(capsys, report_schema):
    budget = _budget(H100, 0.5)
    assert main(["analyze", str(H100), "--no-cache", "-f", "json", "--memory-budget", str(budget)]) in (0, 1)
    report = json.loads(capsys.readouterr().out)
    assert sum(n.startswith("memory budget: ") for n in report["notes"]) == 2
    source = report["source"]["inputs"][0]
    part = load(H100, cache=False, budget=budget)
    assert source["memory_budget_bytes"] == budget and source["analysed_events"] == part.gpu.height + part.cpu.height
    assert source["events"] == part.meta.event_count > source["analysed_events"]
    import jsonschema

    jsonschema.validate(report, report_schema)
    assert report["findings"]
    assert main(["analyze", str(H100), "--no-cache", "-f", "json", "--memory-budget", "none"]) in (0, 1)
    assert not any(n.startswith("memory budget") for n in json.loads(capsys.readouterr().out)["notes"])


@pytest.mark.parametrize("text, want", [("1.5G", 1_500_000_000), ("800M", 800_000_000), ("800MB", 800_000_000), ("4GiB", 4 * 2**30),
                                        ("2000000000", 2_000_000_000), ("none", None), ("2.5g", 2_500_000_000)])  # fmt: skip
def test_budget_sizes(text, want):
    from proflab.cli._reading import budget_bytes

    assert budget_bytes(text) == want


@needs_nsys
@pytest.mark.parametrize("text", ["lots", "1.5X", "-1G", "", "0", "512k"])  # ("0": too small, not "no limit")
def test_a_budget_that_is_no_size_is_a_usage_error(text, capsys):
    with pytest.raises(SystemExit) as e:
        main(["analyze", str(H100), "--memory-budget", text])
    assert e.value.code == 2
    assert "--memory-budget" in capsys.readouterr().err


@needs_nsys
def test_a_budget_below_what_any_analysis_needs_is_refused(capsys):
    with pytest.raises(UsageError, match="below the 160 MB any analysis of this trace needs"):
        load(H100, cache=False, budget=100_000_000)
    assert main(["analyze", str(H100), "--no-cache", "--memory-budget", "100M"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "below the 160 MB" in err[0]


@needs_nsys
def test_the_report_cache_tells_budgets_apart(tmp_path, monkeypatch, capsys):
    """A report made within one budget is not answered for another (nor for none)."""
    monkeypatch.setenv("PROFLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PROFLAB_CACHE_MIN_MB", "0")  # (the export is 2 MB)
    big = tmp_path / "h.sqlite"
    shutil.copyfile(H100, big)
    budget = _budget(big, 0.5)
    assert main(["analyze", str(big), "-f", "json", "--memory-budget", str(budget)]) in (0, 1)
    first = json.loads(capsys.readouterr().out)
    assert main(["analyze", str(big), "-f", "json", "--memory-budget", "none"]) in (0, 1)
    second = json.loads(capsys.readouterr().out)
    assert any(n.startswith("memory budget") for n in first["notes"])
    assert not any(n.startswith("memory budget") for n in second["notes"])


@needs_nsys
def test_sql_over_a_part_read_for_the_budget_says_so_on_stderr(capsys):
    budget = _budget(H100, 0.5)
    assert main(["sql", str(H100), "SELECT count(*) AS n FROM gpu", "--no-cache", "--memory-budget", str(budget), "-f", "json"]) == 0
    captured = capsys.readouterr()
    n = json.loads(captured.out)[0]["n"]
    assert n == load(H100, cache=False, budget=budget).gpu.height < load(H100, cache=False).gpu.height
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("proflab: memory budget: reading h100_2gpu_1s.sqlite whole would need about ")
    assert lines[0].endswith("; the query sees that part")


@needs_nsys
def test_reports_say_what_the_budget_left_out_under_their_header():
    """A reader of the terminal or Markdown report sees that a part was analysed before any
    figure of it (the notes at the end are easy to miss); the HTML page puts every note above
    the findings."""
    from proflab.api import analyze
    from proflab.render import render

    report = analyze(load(H100, cache=False, budget=_budget(H100, 0.5)))
    term = render([report], "term", width=100, color=False).splitlines()
    assert term[1].startswith("memory budget: reading h100_2gpu_1s.sqlite whole would need about ")
    window = next(i for i, line in enumerate(term) if line.startswith("Window "))
    assert sum(line.startswith("memory budget: ") for line in term[:window]) == 2
    assert not any(line.startswith("note: memory budget") for line in term)  # said once
    md = render([report], "md", width=100, color=False)
    assert md.index("memory budget: reading") < md.index("- Window: ")
    from proflab.render.html import render_html

    html = render_html([report])
    assert html.index("note: memory budget: reading") < html.index("Findings")


@needs_nsys
def test_compare_says_a_side_was_analysed_in_a_part():
    """Without profiler steps a comparison sets totals side by side: parts of different spans
    would pass for a change, so the caveats say a side was read for the budget, and how to
    compare alike."""
    import proflab

    budget = _budget(H100, 0.5)
    c = proflab.compare(H100, H100, cache=False, memory_budget=budget)
    said = [x for x in c.caveats if "memory budget" in x]
    assert said == ["before and after: analysed in a part of the trace for the memory budget (the report's notes say which); "
                    "totals over parts of different spans do not compare: give both sides --memory-budget none or the same --window"]
    whole = proflab.compare(H100, H100, cache=False, memory_budget=None)
    assert not any("memory budget" in x for x in whole.caveats)


# -- Kineto traces: parts read back from the slices decoded to disk ------------------------------

KINETO = Path(__file__).resolve().parent / "data" / "kineto" / "train_loop.pt.trace.json.gz"


@pytest.fixture(scope="module")
def plain_kineto(tmp_path_factory) -> Path:
    import gzip

    path = tmp_path_factory.mktemp("kineto") / "train_loop.pt.trace.json"
    path.write_bytes(gzip.decompress(KINETO.read_bytes()))
    return path


def _same_trace(got, want) -> None:
    for table in ("gpu", "cpu", "steps", "devices", "comms"):
        assert_frame_equal(getattr(got, table), getattr(want, table))
    assert got.meta == want.meta


SPILLED = ["steps 3:5", "steps 4", "steps 5:", "window 100ms:300ms", "window 0:1", "window 250ms:"]


@pytest.mark.parametrize("text", SPILLED)
def test_a_kineto_part_read_from_its_decoded_slices_is_the_whole_read_sliced(text):
    """The slices go to Arrow files as they are decoded, and only the part is read back: the
    same events, in the same order, with the same steps, notes and meta as slicing a whole
    read (a window clips events to it: their order is the whole read's, by the start before
    clipping)."""
    from proflab.model.slicing import parse_steps, parse_window, slice_trace
    from proflab.readers import kineto

    kind, arg = text.split()
    spec = parse_steps(arg) if kind == "steps" else parse_window(arg)
    _same_trace(kineto.read(KINETO, spec), slice_trace(kineto.read(KINETO), spec))


@pytest.mark.parametrize("text", ["steps 3:5", "window 100ms:300ms"])
def test_a_kineto_part_read_with_the_helper_process_is_the_whole_read_sliced(monkeypatch, plain_kineto, text):
    """With small slices a plain trace is shared with the helper process, whose slices are
    moved into the folder rather than read."""
    from proflab.model.slicing import parse_steps, parse_window, slice_trace
    from proflab.readers import kineto

    if not kineto.helper_allowed():
        pytest.skip("one core: the reader uses no helper process")
    # the helper process shares the slices where the compiled decoder is not built (with it,
    # two threads of this process decode them: tests/test_native_decoder.py)
    monkeypatch.setenv("PROFLAB_PURE_PYTHON", "1")
    monkeypatch.setattr(kineto, "_CHUNK_BYTES", 256 * 1024)  # ~30 slices, shared with the helper
    helped: list = []
    result = kineto._Helper.result

    def spy(self, first, spill=None):
        got = result(self, first, spill)
        helped.append((got is not None and len(got) > 0, spill is not None))
        return got

    monkeypatch.setattr(kineto._Helper, "result", spy)
    from test_reader import _after_helper_starts

    monkeypatch.setattr(kineto._Helper, "claim", _after_helper_starts(kineto._Helper.claim))
    kind, arg = text.split()
    spec = parse_steps(arg) if kind == "steps" else parse_window(arg)
    got = kineto.read(plain_kineto, spec)
    assert helped == [(True, True)], "the helper decoded no slice"
    _same_trace(got, slice_trace(kineto.read(plain_kineto), spec))


def _kineto_budget(path: Path) -> int:
    """A budget whose room holds about half the trace's events (counted after decoding)."""
    from proflab.readers import kineto

    whole = kineto.read(path)
    return limits.KINETO_PART_FIXED + limits.KINETO_PART_EVENT * (whole.gpu.height + whole.cpu.height) // 2


def test_a_kineto_trace_over_the_budget_is_read_in_whole_steps_from_its_middle():
    import dataclasses

    from proflab.model.slicing import parse_steps
    from proflab.readers import kineto

    budget = _kineto_budget(KINETO)
    got = load(KINETO, cache=False, budget=budget)
    assert got.meta.budget == budget
    assert got.steps["step"].to_list() == [4]  # of 3, 4 and 5: the middle one (the room holds 40 % of the events)
    said = [n for n in got.meta.notes if n.startswith("memory budget: ")]
    same = kineto.read(KINETO, parse_steps("4:5"))  # the same part, asked for by --steps
    _same_trace(got, dataclasses.replace(same, meta=dataclasses.replace(same.meta, notes=(*same.meta.notes, *said), budget=budget)))
    kept = got.gpu.height + got.cpu.height
    assert said[0].startswith("memory budget: reading train_loop.pt.trace.json.gz whole would need about ")
    assert f"events, estimated from their count), over the budget of {budget / 1e6:.0f} MB; analysed profiler steps 4:5: " in said[0]
    assert f"{kept:,} of its {got.meta.event_count:,} events" in said[0]
    kernels = kineto.read(KINETO).gpu.filter(pl.col("kind") == "kernel")
    part = got.gpu.filter(pl.col("kind") == "kernel")
    whole_ms = kernels["dur_ns"].sum() / 1e6
    assert f"of the trace's {whole_ms:,.1f} ms" in said[1]
    lo, hi = int(got.steps["start_ns"][0]), int(got.steps["end_ns"][0])
    inside = kernels.select((pl.min_horizontal(pl.col("start_ns") + pl.col("dur_ns"), hi) - pl.max_horizontal("start_ns", lo))
                            .clip(lower_bound=0).sum()).item()
    assert said[1].startswith(f"memory budget: the part runs {inside / 1e6:,.1f} ms of kernels")
    assert part.height > 0
    # the copies: their share of kernel and copy time in the part and in the whole trace
    copies = kineto.read(KINETO).gpu.filter(pl.col("kind") == "memcpy")
    copy_in = copies.select((pl.min_horizontal(pl.col("start_ns") + pl.col("dur_ns"), hi) - pl.max_horizontal("start_ns", lo))
                            .clip(lower_bound=0).sum()).item()
    whole_pct = 100 * copies["dur_ns"].sum() / (copies["dur_ns"].sum() + kernels["dur_ns"].sum())
    assert copies.height and f"copies are {100 * copy_in / (copy_in + inside):.1f}% of its kernel and copy time, {whole_pct:.1f}% of the trace's" in said[1]
    # the steps: the part's one against the trace's three, host ranges
    steps = kineto.read(KINETO).steps.with_columns(((pl.col("end_ns") - pl.col("start_ns")) / 1e6).alias("ms"))
    mine, median = steps.filter(pl.col("step") == 4)["ms"][0], steps["ms"].median()
    assert said[2].startswith(f"memory budget: the part's 1 step takes {mine:,.3f} ms (host ranges), "
                              f"the whole trace's 3 steps a median of {median:,.3f} ms")
    assert ("NOT like" in said[2]) == (abs(mine - median) > 0.1 * median)


def test_load_reads_an_over_budget_kineto_part_without_caching_it(tmp_path, monkeypatch):
    """A part of a trace over the budget is read from its decoded slices, not by a whole
    read that fills the cache: the cache folder stays empty."""
    from proflab.model.slicing import parse_steps

    monkeypatch.setenv("PROFLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PROFLAB_CACHE_MIN_MB", "0")
    got = load(KINETO, part=parse_steps("4"), budget=limits.KINETO_PART_FIXED + 1)
    assert got.steps["step"].to_list() == [4] and got.meta.budget is None
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.arrow")) and not any((tmp_path / "cache").rglob("*.parquet"))
    load(KINETO, part=parse_steps("4"), budget=None)  # no budget: the whole read is cached, as before
    assert any(p.is_file() for p in (tmp_path / "cache").rglob("*"))


def test_the_cli_reads_a_kineto_trace_within_a_budget(capsys):
    budget = _kineto_budget(KINETO)
    assert main(["analyze", str(KINETO), "--no-cache", "-f", "json", "--memory-budget", str(budget)]) in (0, 1)
    report = json.loads(capsys.readouterr().out)
    source = report["source"]["inputs"][0]
    assert source["memory_budget_bytes"] == budget and source["analysed_events"] < source["events"]
    assert sum(n.startswith("memory budget: ") for n in report["notes"]) == 3  # read, kernels, steps
    assert report["steps"] and {s["step"] for s in report["steps"]} == {4}


def test_a_kineto_trace_whose_size_misled_the_estimate_is_read_whole(tmp_path, monkeypatch):
    """The estimate from a trace's size takes 300 bytes an event; 40 MB of blanks between its
    events make the recorded trace look like 140 k more. Once its slices are decoded its
    events are counted, the whole read fits, and it is read whole as usual (no part, no
    budget notes), the same trace as without a budget."""
    import gzip

    from proflab.readers import kineto

    raw = gzip.decompress(KINETO.read_bytes())
    at = raw.index(b"\n  {")
    padded = tmp_path / "padded.json"
    padded.write_bytes(raw[:at] + b" " * 40_000_000 + raw[at:])
    whole = kineto.read(padded)
    counted = limits.kineto_need(padded, whole.meta.event_count)
    budget = counted + 1_000_000
    assert limits.kineto_need(padded) > budget  # the size says it is over
    spilled, read_whole = [], []
    monkeypatch.setattr(kineto, "_read_spilled", _recording(kineto._read_spilled, spilled))
    monkeypatch.setattr(kineto, "_read", _recording(kineto._read, read_whole))
    got = load(padded, cache=False, budget=budget)
    assert len(spilled) == 1 and len(read_whole) == 1  # decoded to disk, counted, then read whole
    assert got.meta.budget is None
    _same_trace(got, whole)


def _recording(fn, calls: list):
    def wrapper(*args, **kwargs):
        calls.append(args)
        return fn(*args, **kwargs)

    return wrapper


@needs_nsys
def test_steps_longer_than_the_room_leave_a_time_window(tmp_path):
    """Two steps, each half the export, and room for a quarter: no whole step fits, so a time
    window from the middle is read, and the note says why."""
    stepped = with_steps(H100, tmp_path / "two.sqlite", n=2, first=0)
    got = load(stepped, cache=False, budget=_budget(stepped, 0.3))
    assert got.steps.height == 0  # neither step lies wholly inside the window
    note = next(n for n in got.meta.notes if n.startswith("memory budget: reading"))
    assert "analysed a time window in its middle (" in note and "), since no whole profiler step fits it: " in note
    assert not any(n.startswith("memory budget: the part's") for n in got.meta.notes)  # no steps to compare


def test_choose_on_a_sample_of_one_instant():
    """Every sampled event starting at one instant: a window of 1 ns there, not an error."""
    import numpy as np

    plan = limits.choose(np.full(100, 5_000, dtype=np.int64), np.full(100, 1e6), need=limits.COST_FIXED + 100_000_000,
                         budget=limits.COST_FIXED + 50_000_000, fixed=limits.COST_FIXED, steps=pl.DataFrame(schema={"step": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64}),
                         margin=limits.PART_MARGIN)
    assert (plan.lo_ns, plan.hi_ns, plan.steps) == (5_000, 5_001, None)


def _layouts(doc: dict) -> dict[str, str]:
    """The same document in layouts other than Kineto's: one compact event a line, indented
    by json.dumps(indent=2), all on one line, and the Chrome "JSON array" form on one line."""
    rest = {k: v for k, v in doc.items() if k != "traceEvents"}
    lines = json.dumps(rest)[:-1] + ', "traceEvents": [\n' + ",\n".join(json.dumps(e, separators=(",", ":")) for e in doc["traceEvents"]) + "\n]}"
    return {"compact_lines": lines, "indent2": json.dumps(doc, indent=2), "one_line": json.dumps(doc, separators=(",", ":")),
            "array": json.dumps(doc["traceEvents"])}


@pytest.mark.parametrize("layout", ["compact_lines", "indent2", "one_line", "array"])
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
def test_any_layout_is_cut_into_slices_and_read_in_a_part(tmp_path, monkeypatch, layout, gz):
    """A trace in any layout of valid JSON is cut into slices by its structure (a plain file
    planned, a .gz one streamed): small slices (about 60 of them, each read's state carried
    across 100 kB reads) give the same trace as the Kineto-layout original; under a budget
    that holds half its events it is read in the same part as the original (step 4 of 3-5),
    the same tables, and analysed into the same report (such a file was once "not in Kineto's
    own layout ... read whole over the budget": no longer)."""
    from proflab.readers import _slices, kineto
    from proflab.report.analyze import analyze

    doc = json.loads(gzip.decompress(KINETO.read_bytes()))
    text = _layouts(doc)[layout].encode()
    path = tmp_path / ("t.pt.trace.json" + (".gz" if gz else ""))
    path.write_bytes(gzip.compress(text, 1) if gz else text)
    want = kineto.read(KINETO)
    monkeypatch.setattr(kineto, "_CHUNK_BYTES", 64 * 1024)
    monkeypatch.setattr(_slices, "_READ_BYTES", 100_000)
    monkeypatch.setattr(_slices, "_INFLATED_BYTES", 50_000)
    cuts: list = []
    plan = _slices.MappedSlicer._general_plan
    monkeypatch.setattr(_slices.MappedSlicer, "_general_plan", lambda self: cuts.append(1) or plan(self))
    got = kineto.read(path)
    # (the array form holds events only: no device properties)
    tables = ("gpu", "cpu", "steps", "comms") + (() if layout == "array" else ("devices",))
    for table in tables:
        assert_frame_equal(getattr(got, table), getattr(want, table))
    assert gz or cuts  # a plain file was planned by its structure
    budget = _kineto_budget(KINETO)
    part = load(path, cache=False, budget=budget)
    ref = load(KINETO, cache=False, budget=budget)
    assert part.meta.budget == budget and part.steps["step"].to_list() == [4]
    for table in ("gpu", "cpu", "steps"):
        assert_frame_equal(getattr(part, table), getattr(ref, table))
    assert not any("read whole" in n for n in part.meta.notes)
    if layout == "array":
        return
    a, b = analyze(part).to_dict(), analyze(ref).to_dict()
    for d in (a, b):
        d.pop("source", None)
        d["notes"] = [n.replace(path.name, "X").replace(KINETO.name, "X") for n in d.get("notes", [])]
    assert a == b


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 7, 64])
def test_the_structure_is_found_across_reads(chunk):
    """Strings holding brackets, commas, colons, escaped quotes and runs of backslashes, a
    key named like the events array inside an event, and reads of a few bytes each (every
    state carried across a read's edge): the separators found are the array's own."""
    from proflab.readers._slices import boundaries

    events = [{"name": 'a\\"],[{', "args": {"traceEvents": [1, 2], "s": "\\\\"}},
              {"name": "\\", "x": [{"y": "]"}]}, {"k": "tr\"aceEvents"}, {}, {"z": ",,::"}]
    doc = json.dumps({"deviceProperties": [{"name": "[x]"}], "traceEvents": events, "after": "]}"})
    data = doc.encode()
    chunks = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    open_at, ranges, close, array_form, last = boundaries(chunks, 1)
    assert not array_form and data[open_at : close + 1] == json.dumps(events).encode()
    pieces = [json.loads(b"[" + data[a + 1 : b] + b"]") for a, b in ranges]
    assert [e for p in pieces for e in p] == events and len(ranges) == len(events)
    assert last == ranges[-1][0]


@pytest.mark.parametrize("chunk", [7, 1 << 20])
def test_the_events_array_is_found_after_many_keys(chunk):
    """A head of many short top-level keys, a key named like the array's with blanks around
    its colon, one not after ``{`` or ``,`` (inside a string): the array is the
    ``"traceEvents"`` key's. (Each colon's key is read in place: a copy of all before each one
    was quadratic, 3.45 s for this head of 1.8 MB where it is now 0.14 s, ``benchmarks`` not
    being the place for a damaged file.)"""
    from proflab.readers._slices import boundaries

    events = [{"ph": "X", "ts": i} for i in range(5)]
    head = '{"x": "a,\\"traceEvents\\": [0]", ' + '"a":1,' * 20000 + ' "traceEvents" \t: '
    data = (head + json.dumps(events) + "}").encode()
    open_at, ranges, close, array_form, _ = boundaries([data[i : i + chunk] for i in range(0, len(data), chunk)], 1)
    assert not array_form and data[open_at : close + 1] == json.dumps(events).encode() and len(ranges) == len(events)


@pytest.mark.parametrize("text", ['{"traceEvents": {}}', '{"a": 1}', '"x"', "[1, 2", '{"traceEvents": [1, 2]', "nope"])
def test_no_events_array_is_not_sliceable(text):
    from proflab.readers._slices import NotSliceable, boundaries

    with pytest.raises(NotSliceable):
        boundaries([text.encode()], 1)


def dataclasses_with_notes(trace, notes):
    import dataclasses

    return dataclasses.replace(trace, meta=dataclasses.replace(trace.meta, notes=notes))


def test_no_room_to_decode_a_kineto_trace_to_disk_is_one_line(monkeypatch, capsys):
    """A full disk cannot be had here: the write of a decoded slice is made to fail as a full
    one does (ENOSPC), the one thing not real in this test. The refusal names the trace, the
    folder, the room needed and the ways out; exit status 2, no traceback."""
    import errno

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pl.DataFrame, "write_ipc", full)
    assert main(["analyze", str(KINETO), "--no-cache", "--memory-budget", str(_kineto_budget(KINETO))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train_loop.pt.trace.json.gz: cannot decode it to disk in " in err[0]
    assert "(No space left on device)" in err[0] and "set TMPDIR to a folder with room, or read it whole (--memory-budget none)" in err[0]


# -- polars' allocator, sized by the estimate before polars starts ------------------------------


def _setting(*argv: str) -> str:
    from proflab import cli
    from proflab.cli import _process

    return _process.allocator_setting(cli._parser().parse_args(list(argv)))


@needs_nsys
def test_freed_pages_are_kept_only_where_the_budget_has_room_for_them(tmp_path):
    """An export or a Kineto trace whose estimated whole analysis leaves the budget the room
    kept pages may take (``_process._KEPT_PEAK``) runs with them kept a while (each kind its own
    setting); one that comes near the budget, inputs of both kinds, a folder, a missing file
    or one neither reader would take returns them at once."""
    from proflab.cli import _process

    need = limits.estimate(nsys_sqlite.table_rows(H100))
    kineto = Path(__file__).resolve().parent / "data" / "kineto" / "train_loop.pt.trace.json.gz"
    room = str(int(need * _process._KEPT_PEAK) + 1)
    near = str(int(need * _process._KEPT_PEAK) - 1)
    kept, at_once = _process._EXPORT_KEPT, _process._AT_ONCE
    assert kept.startswith("dirty_decay_ms:100,") and at_once.startswith("dirty_decay_ms:0,")
    assert _setting("analyze", str(H100)) == kept
    assert _setting("analyze", str(H100), "--memory-budget", room) == kept
    assert _setting("analyze", str(H100), "--memory-budget", near) == at_once
    assert _setting("analyze", str(H100), "--memory-budget", "none") == kept
    for argv in (["sql", str(H100), "select 1"], ["compare", str(H100), str(H100)], ["report", str(H100)]):
        assert _setting(*argv) == kept, argv
    assert _setting("analyze", str(H100.parent)) == at_once
    assert _setting("analyze", str(tmp_path / "gone.sqlite")) == at_once
    assert _setting("sql") == at_once
    # a Kineto trace, by its size (a gzip one's from its trailer): 10 ms in one arena
    kineto_need = limits.kineto_need(kineto)
    json_bytes = len(gzip.decompress(kineto.read_bytes()))  # (read alone: a gzip trace is not shared)
    assert kineto_need == limits.KINETO_FIXED + limits.KINETO_ALONE_EVENT * (json_bytes // 300)
    assert _setting("analyze", str(kineto)) == _process._KINETO_KEPT == "dirty_decay_ms:10,muzzy_decay_ms:0,narenas:1"
    assert _setting("compare", str(kineto), str(kineto)) == _process._KINETO_KEPT
    assert _setting("analyze", str(kineto), "--memory-budget", str(int(kineto_need * _process._KEPT_PEAK) + 1)) == _process._KINETO_KEPT
    assert _setting("analyze", str(kineto), "--memory-budget", str(int(kineto_need * _process._KEPT_PEAK) - 1)) == at_once
    # a Kineto trace over the budget is read in a part at once (its parts' room is an export's)
    assert _setting("analyze", str(kineto), "--memory-budget", str(kineto_need - 1)) == at_once
    assert _setting("compare", str(H100), str(kineto)) == at_once  # two kinds
    # files neither reader takes: no estimate, pages returned at once
    (tmp_path / "notes.txt").write_text("not a trace\n")
    (tmp_path / "x.nsys-rep").write_bytes(b"{" + b" " * 100)
    for name in ("notes.txt", "x.nsys-rep"):
        assert _setting("analyze", str(tmp_path / name)) == at_once, name
        assert _setting("compare", str(kineto), str(tmp_path / name)) == at_once, name


@pytest.mark.parametrize("need_gb, budget_gb, chosen, kept", [
    (1.0, None, False, True),  # no budget
    (1.0, 1.5, False, True),  # whole, with the room
    (1.3, 1.5, False, False),  # whole, near the budget
    (1.5, 1.5, False, False),  # whole, at the budget
    (1.56, 1.5, False, True),  # a part the budget plans: it fills 70 % of what is left beyond the fixed cost
    (4.0, 1.5, False, True),
    (4.0, 1.5, True, False),  # --steps / --window: read as chosen, whatever its size
    (4.0, 0.361, False, True),  # 2.25 times the fixed cost (360 MB): about the least budget whose part leaves the room
    (4.0, 0.355, False, False),
    (4.0, 0.1, False, False),  # below the fixed cost: refused
])
def test_kept_pages_where_a_whole_read_or_a_planned_part_leaves_room(need_gb, budget_gb, chosen, kept):
    from proflab.cli import _process

    need, budget = int(need_gb * 1e9), None if budget_gb is None else int(budget_gb * 1e9)
    assert _process._room_for_kept(need, budget, chosen) is kept
    # a Kineto trace's part (decoded to disk, then read back) is not planned as an export's
    whole = budget is None or need * _process._KEPT_PEAK <= budget
    assert _process._room_for_kept(need, budget, chosen, part=False) is whole


@needs_nsys
@pytest.mark.parametrize("budget, expected", [(None, "dirty_decay_ms:100,muzzy_decay_ms:0"), ("1M", "dirty_decay_ms:0,muzzy_decay_ms:0")])
def test_the_cli_starts_polars_with_the_setting_its_input_allows(budget, expected):
    """The setting is made after the command line is read and before polars loads: a fresh
    interpreter running ``proflab sql`` on the export (1M: a budget far under its estimate).
    Polars puts its own default first once it has loaded; what follows it wins."""
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    argv = ["sql", str(H100), "select 1", *(["--memory-budget", budget] if budget else [])]
    code = f"import os, sys; from proflab import cli; rc = cli.main({argv!r}); print(os.environ['_RJEM_MALLOC_CONF'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.stdout.strip().splitlines()[-1].endswith(expected), out.stderr


@needs_nsys
def test_whole_export_scans_split_by_rowid_give_what_one_scan_gives(monkeypatch):
    """The extent and the kernel and copy comparison run in a rowid range per reading thread,
    each on a connection of its own (``_Ctx.halves`` / ``scan``): their counts, first start and
    kernel and copy sums are those of one scan of each table on one connection."""
    import adbc_driver_sqlite.dbapi as adbc

    monkeypatch.setattr(nsys_sqlite, "_CHUNK_ROWS", 1000)  # every event table of the fixture split
    uri = nsys_sqlite.read_only_uri(H100)
    con, bulk = sqlite3.connect(uri, uri=True), adbc.connect(uri)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        ctx = nsys_sqlite._Ctx(H100, con, bulk, tables, lambda: adbc.connect(uri))
        assert len(ctx.halves("CUPTI_ACTIVITY_KIND_KERNEL")) == nsys_sqlite._READ_THREADS
        count, first = 0, []
        for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
                  "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER", "NVTX_EVENTS", "OSRT_API"):  # fmt: skip
            if t in tables:
                nvtx = " AND eventType IN (59, 60)" if t == "NVTX_EVENTS" else ""
                n, f = con.execute(f"SELECT count(*), min(start) FROM {t} WHERE end >= start{nvtx}").fetchone()
                count += n
                first += [f] if f is not None else []
        assert ctx.extent() == (count, min(first)) and count > 10_000
        lo, hi = con.execute("SELECT min(start), max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
        mid = (lo + hi) // 2
        rows = con.execute(
            f"SELECT demangledName, sum(end - start), sum(CASE WHEN start < {hi} AND end > {mid} THEN min(end, {hi}) - max(start, {mid}) "
            "ELSE 0 END) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE end >= start GROUP BY demangledName"
        ).fetchall()  # fmt: skip
        copies = con.execute(
            f"SELECT sum(end - start), sum(CASE WHEN start < {hi} AND end > {mid} THEN min(end, {hi}) - max(start, {mid}) ELSE 0 END) "
            "FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE end >= start"
        ).fetchone()  # fmt: skip
        one = limits.kernel_likeness(rows, copies)
        one["kernel"] = ctx.string_of(one["kernel"])
        assert "copies_points" in one and copies[0] > 0
        assert limits.likeness(ctx, mid, hi) == one and 0 < one["part_ns"] < one["whole_ns"]
        ctx.close_readers()
    finally:
        con.close()
        bulk.close()
