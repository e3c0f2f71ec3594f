"""SQL over a trace: query results against the same computation in polars on real recorded
traces, the tables users can discover, the locked-down connection, and the ``proflab sql``
command through ``main(argv)`` and as a process."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import proflab
from proflab.analysis import Context
from proflab.cli import main
from proflab.errors import QueryError, UsageError
from proflab.sql import TABLES, catalog, query, tables

# the page of the documentation that documents `proflab sql` (it was the README's section)
README = Path(__file__).resolve().parents[1] / "docs" / "commands" / "sql.md"


def _plain(df: pl.DataFrame) -> pl.DataFrame:
    return df.with_columns(pl.col(c).cast(pl.String) for c, t in df.schema.items() if isinstance(t, (pl.Enum, pl.Categorical)))


@pytest.fixture(scope="module")
def train_path(find_trace) -> Path:
    return find_trace("train_loop")


@pytest.fixture(scope="module")
def train(train_path):
    return proflab.load(train_path)


@pytest.fixture(scope="module")
def pageable_path(find_trace) -> Path:
    return find_trace("pageable_h2d")


@pytest.fixture(scope="module")
def pageable(pageable_path):
    return proflab.load(pageable_path)


# -- query() against polars ----------------------------------------------------------------------


def test_kernel_count_and_time_per_name(train):
    got = query(
        train,
        "SELECT name, count(*) AS n, sum(dur_ns) AS total_ns FROM kernels GROUP BY name ORDER BY total_ns DESC, name",
    )
    want = (
        train.kernels.group_by("name")
        .agg(pl.len().cast(pl.Int64).alias("n"), pl.col("dur_ns").sum().alias("total_ns"))
        .sort(["total_ns", "name"], descending=[True, False])
    )
    assert want.height > 10
    assert_frame_equal(got, want)


def test_memcpy_bytes_by_direction(pageable):
    got = query(
        pageable,
        "SELECT copy_kind, src_kind, dst_kind, count(*) AS n, sum(bytes) AS bytes "
        "FROM gpu WHERE kind = 'memcpy' GROUP BY ALL ORDER BY copy_kind, src_kind, dst_kind",
    )
    want = (
        _plain(pageable.memcpy)
        .group_by("copy_kind", "src_kind", "dst_kind")
        .agg(pl.len().cast(pl.Int64).alias("n"), pl.col("bytes").sum())
        .sort("copy_kind", "src_kind", "dst_kind")
    )
    assert_frame_equal(got, want)
    # the planted workload: pageable host-to-device copies
    assert ("HtoD", "Pageable") in set(zip(got["copy_kind"], got["src_kind"]))


def test_idle_gaps_by_cause_per_step(train):
    got = query(
        train,
        "SELECT step, cause, count(*) AS gaps, sum(dur_ns) AS idle_ns FROM gaps GROUP BY ALL ORDER BY step, cause",
    )
    want = (
        _plain(Context(train).gaps)
        .group_by("step", "cause")
        .agg(pl.len().cast(pl.Int64).alias("gaps"), pl.col("dur_ns").sum().alias("idle_ns"))
        .sort("step", "cause", nulls_last=True)
    )
    assert set(want["cause"]) >= {"host", "sync"}
    assert_frame_equal(got, want)


# hot_kernels reports the most common grid of each kernel; between equally common grids the
# analysis picks either, so two computations may differ there and only there.
_TIED_MODE = {"hot_kernels": ["grid"]}


def _comparable(name: str, df: pl.DataFrame) -> pl.DataFrame:
    return df.drop(_TIED_MODE.get(name, []))


@pytest.mark.parametrize("name", list(TABLES))
def test_every_table_round_trips_through_sql(train, name):
    """SELECT * gives back exactly the frame tables() builds: values, nulls, types, order."""
    want = tables(train)[name]
    got = query(train, f"SELECT * FROM {name}")
    assert want.height > 0, f"{name} is empty on the training trace"
    assert got.schema == want.schema
    assert_frame_equal(_comparable(name, got), _comparable(name, want))


def test_a_table_read_twice_in_one_query(train):
    """A self-join scans a table twice: with DuckDB from 1.5 the frames are registered as they
    are (``sql._rescannable``), before it copied in; either way every kernel meets itself."""
    import duckdb

    from proflab.sql import _rescannable

    got = query(train, "SELECT count(*) AS n FROM kernels a JOIN kernels b ON a.correlation = b.correlation")["n"][0]
    k = train.gpu.filter(pl.col("kind") == "kernel")
    assert got == k.group_by("correlation").len().select((pl.col("len") ** 2).sum()).item() > 0
    assert _rescannable(duckdb.__version__) == (tuple(int(x) for x in duckdb.__version__.split(".")[:2]) >= (1, 5))
    assert _rescannable("1.5.0") and _rescannable("2.0.1") and not _rescannable("1.4.3") and not _rescannable("1.1.0")


def test_hot_kernel_grid_is_one_of_the_kernels_grids(train):
    got = query(train, "SELECT name, grid FROM hot_kernels")
    seen = (
        train.kernels.select("name", pl.format("{}x{}x{}", "grid_x", "grid_y", "grid_z").alias("grid"))
        .unique()
        .rows()
    )
    assert got.height > 0 and set(got.rows()) <= set(seen)


def test_model_tables_are_the_trace_plus_end_ns(train):
    t = tables(train)
    gpu = _plain(train.gpu).with_columns((pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))
    assert_frame_equal(t["gpu"].select(gpu.columns), gpu)
    assert t["gpu"].columns.index("end_ns") == t["gpu"].columns.index("dur_ns") + 1
    assert_frame_equal(t["cpu"].drop("end_ns"), _plain(train.cpu))
    assert_frame_equal(t["steps"].drop("dur_ns"), train.steps)
    assert (t["steps"]["dur_ns"] == train.steps["end_ns"] - train.steps["start_ns"]).all()
    assert_frame_equal(t["devices"], train.devices)


def test_derived_tables_are_the_analysis_tables(train):
    ctx = Context(train)
    t = tables(train)
    assert_frame_equal(t["gaps"], _plain(ctx.gaps))
    assert_frame_equal(t["step_breakdown"].drop("end_ns"), ctx.step_table)
    assert_frame_equal(_comparable("hot_kernels", t["hot_kernels"]), _comparable("hot_kernels", ctx.hot_kernels(None)))
    assert_frame_equal(t["memcpy_summary"], _plain(ctx.memcpy_table))
    rows = ctx.kernel_rows
    assert not {"kind", "bytes", "copy_kind", "src_kind", "dst_kind"} & set(rows.columns)  # copy columns left out
    assert rows.height == train.gpu.filter(pl.col("kind") == "kernel").height
    assert_frame_equal(t["kernels"].drop("end_ns"), rows)


def test_launching_operator_is_joined(train):
    got = query(train, "SELECT op, count(*) AS n FROM kernels WHERE op IS NOT NULL GROUP BY op ORDER BY n DESC, op")
    want = (
        Context(train).kernel_rows.drop_nulls("op")
        .group_by("op")
        .agg(pl.len().cast(pl.Int64).alias("n"))
        .sort(["n", "op"], descending=[True, False])
    )
    assert want.height > 0
    assert_frame_equal(got, want)


def test_repeated_names_and_wide_sums(train):
    """A self-join repeats column names; sum() of BIGINT is HUGEINT in DuckDB. Both come back
    usable: unique names, 64-bit integers equal to polars' sums."""
    got = query(
        train,
        "SELECT a.step, b.step, sum(a.dur_ns) AS s FROM steps a, steps b GROUP BY ALL ORDER BY ALL",
    )
    assert got.columns == ["step", "step_1", "s"]
    assert got.schema["s"] == pl.Int64
    n = train.steps.height
    assert got.height == n * n
    per_a = dict(zip(train.steps["step"], train.steps["end_ns"] - train.steps["start_ns"]))
    assert all(s == per_a[a] for a, s in zip(got["step"], got["s"]))


def test_nested_and_null_results(train):
    got = query(train, "SELECT [1, 2] AS l, {'k': NULL::BIGINT} AS st, NULL::VARCHAR AS s, 1.5::DECIMAL(4, 2) AS d")
    assert got.to_dicts() == [{"l": [1, 2], "st": {"k": None}, "s": None, "d": 1.5}]
    assert got.schema["s"] == pl.String


def test_show_tables_lists_exactly_the_tables(train):
    assert sorted(query(train, "SHOW TABLES")["name"]) == sorted(TABLES)


def test_query_accepts_a_path(pageable_path, pageable):
    assert query(pageable_path, "SELECT count(*) AS n FROM gpu")["n"].to_list() == [pageable.gpu.height]


def test_cpu_only_trace_has_every_table_with_its_columns(cpu_trace, train):
    cpu_tables = tables(cpu_trace)
    for name, df in tables(train).items():
        assert cpu_tables[name].columns == df.columns, name
    assert query(cpu_trace, "SELECT count(*) AS n FROM hot_kernels")["n"].to_list() == [0]


from shared_fixtures import NSYS  # noqa: E402


@pytest.mark.skipif(not NSYS.exists(), reason="shared fixtures folder (../shared/fixtures/nsys) is absent")
def test_nsight_systems_export_has_the_same_tables():
    """An Nsight Systems export reads into the same model, so the same SQL works on it."""
    path = min(NSYS.glob("*.sqlite"), key=lambda p: p.stat().st_size)
    trace = proflab.load(path)
    built = tables(trace)
    assert [list(df.columns) for df in built.values()] == [list(df.columns) for df in tables(_empty()).values()]
    got = query(trace, "SELECT device, count(*) AS n, sum(dur_ns) AS total_ns FROM kernels GROUP BY device ORDER BY device")
    want = (
        trace.kernels.group_by("device")
        .agg(pl.len().cast(pl.Int64).alias("n"), pl.col("dur_ns").sum().alias("total_ns"))
        .sort("device")
    )
    assert want.height > 0
    assert_frame_equal(got, want)
    assert_frame_equal(query(trace, "SELECT * FROM gaps"), built["gaps"])


def _empty():
    from proflab.model import Trace, TraceMeta
    from proflab.model.trace import CPU_SCHEMA, DEVICE_SCHEMA, GPU_SCHEMA, STEP_SCHEMA

    return Trace(
        pl.DataFrame(schema=GPU_SCHEMA),
        pl.DataFrame(schema=CPU_SCHEMA),
        pl.DataFrame(schema=STEP_SCHEMA),
        pl.DataFrame(schema=DEVICE_SCHEMA),
        TraceMeta(source="", format="none"),
    )


# -- the catalogue ---------------------------------------------------------------------------------


def test_catalog_lists_every_column_of_every_table(train):
    cat = catalog(train)
    assert list(dict.fromkeys(cat["table"])) == list(TABLES)
    for name, df in tables(train).items():
        part = cat.filter(pl.col("table") == name)
        assert part["column"].to_list() == df.columns
        assert set(part["rows"]) == {df.height}
        assert part["description"][0] == TABLES[name]
    assert "VARCHAR" in cat.filter((pl.col("table") == "gpu") & (pl.col("column") == "kind"))["type"].to_list()


def test_catalog_without_a_trace_has_the_same_columns_and_types(train):
    empty, full = catalog(), catalog(train)
    assert empty["rows"].null_count() == empty.height
    assert_frame_equal(empty.drop("rows"), full.drop("rows"))


# -- errors and the lock-down ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "fragment"),
    [
        ("SELEC name FROM gpu", "syntax error"),
        ("SELECT * FROM no_such_table", "no_such_table"),
        ("SELECT no_such_column FROM gpu", "no_such_column"),
        ("SELECT 'abc'::INTEGER", "Conversion"),
        ("   ", "empty query"),
    ],
)
def test_bad_sql_is_a_query_error_on_one_line(train, sql, fragment):
    with pytest.raises(QueryError) as e:
        query(train, sql)
    assert isinstance(e.value, UsageError)
    msg = str(e.value)
    assert fragment in msg
    assert "\n" not in msg


def test_unknown_table_names_the_real_ones(train):
    with pytest.raises(QueryError) as e:
        query(train, "SELECT * FROM kernel")
    assert "hot_kernels" in str(e.value) and "--tables" in str(e.value)


@pytest.fixture()
def outside(tmp_path) -> Path:
    """A readable CSV file outside the database: a query must not reach it."""
    p = tmp_path / "outside.csv"
    p.write_text("a,b\n1,2\n")
    return p


@pytest.mark.parametrize(
    "template",
    [
        "SELECT * FROM read_csv('{csv}')",
        "SELECT * FROM read_text('{csv}')",
        "SELECT * FROM '{csv}'",
        "SELECT * FROM glob('{dir}/*')",
        "COPY (SELECT 1 AS a) TO '{dir}/written.csv'",
        "COPY gpu TO '{dir}/written.parquet' (FORMAT parquet)",
        "ATTACH '{dir}/other.duckdb' AS other",
        "EXPORT DATABASE '{dir}/export'",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "SET lock_configuration = false",
        "RESET enable_external_access",
    ],
)
def test_files_extensions_and_settings_are_out_of_reach(train, outside, template):
    before = sorted(p.name for p in outside.parent.iterdir())
    sql = template.format(csv=outside, dir=outside.parent)
    with pytest.raises(QueryError) as e:
        query(train, sql)
    assert "\n" not in str(e.value)
    assert sorted(p.name for p in outside.parent.iterdir()) == before


def test_system_files_are_out_of_reach(train):
    with pytest.raises(QueryError, match="disabled|Permission"):
        query(train, "SELECT * FROM read_csv('/etc/passwd')")


def test_temp_directory_is_not_a_way_out(train, tmp_path, monkeypatch):
    """DuckDB always allows its temporary directory (./.tmp by default), even with external
    access off: the connection has none, so nothing can be written there either."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".tmp").mkdir()
    with pytest.raises(QueryError):
        query(train, "COPY (SELECT 1 AS a) TO '.tmp/x.csv'")
    assert list((tmp_path / ".tmp").iterdir()) == []


# -- the command -------------------------------------------------------------------------------------

TOP_KERNELS = "SELECT name, count(*) AS n, sum(dur_ns) AS total_ns FROM kernels GROUP BY name ORDER BY total_ns DESC, name"


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("proflab: error: ")
    assert "Traceback" not in err
    return lines[0]


def test_table_output_fits_80_columns(train_path, train, capsys):
    rc = main(["sql", str(train_path), TOP_KERNELS])
    out, err = capsys.readouterr()
    assert rc == 0, err
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert lines[0].split() == ["name", "n", "total_ns"]
    want = query(train, TOP_KERNELS)
    first = lines[2].split()
    assert first[-2:] == [str(want["n"][0]), str(want["total_ns"][0])]
    assert want["name"][0].startswith(first[0].rstrip("…"))
    assert f"50 of {want.height} rows shown" in out
    assert len(lines) - 2 - out.count("\n", out.index("50 of")) == 50


def test_table_limit_and_all_rows(train_path, train, capsys):
    n = query(train, TOP_KERNELS).height
    assert main(["sql", str(train_path), TOP_KERNELS, "--limit", "5"]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 2 + 5 + 1
    assert f"5 of {n} rows shown" in out
    assert main(["sql", str(train_path), TOP_KERNELS, "--limit", "0"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"{n} rows"
    assert len(out.splitlines()) == 2 + n + 1


def test_table_output_leaves_out_columns_that_do_not_fit(train_path, capsys):
    assert main(["sql", str(train_path), "SELECT * FROM gpu LIMIT 3"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    note = out[out.index("more columns not shown"):]
    assert "shared_mem_bytes" in note and "is_comm" in note
    assert main(["sql", str(train_path), "SELECT * FROM gpu LIMIT 3", "--width", "200"]) == 0
    wide = capsys.readouterr().out
    assert max(len(line) for line in wide.splitlines()) <= 200
    assert len(wide.splitlines()[0].split()) > len(out.splitlines()[0].split())


def test_csv_to_stdout(train_path, train, capsys):
    assert main(["sql", str(train_path), TOP_KERNELS, "-f", "csv"]) == 0
    out = capsys.readouterr().out
    assert_frame_equal(pl.read_csv(io.StringIO(out)), query(train, TOP_KERNELS))


def test_csv_writes_nested_columns_as_json_text(train_path, train, capsys):
    assert main(["sql", str(train_path), "SELECT name, devices FROM hot_kernels", "-f", "csv"]) == 0
    got = pl.read_csv(io.StringIO(capsys.readouterr().out))
    want = tables(train)["hot_kernels"]
    assert got["name"].to_list() == want["name"].to_list()
    assert [json.loads(x) for x in got["devices"]] == want["devices"].to_list()


def test_json_to_stdout(train_path, train, capsys):
    assert main(["sql", str(train_path), "SELECT step, start_ns, dur_ns FROM steps ORDER BY step", "-f", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    want = train.steps.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns")).drop("end_ns")
    assert doc == want.to_dicts()


@pytest.mark.parametrize(
    ("name", "read"),
    [
        ("out.csv", lambda p: pl.read_csv(p)),
        ("out.json", lambda p: pl.DataFrame(json.loads(p.read_text()))),
        ("out.parquet", lambda p: pl.read_parquet(p)),
    ],
)
def test_output_file_format_from_suffix(train_path, train, tmp_path, capsys, name, read):
    target = tmp_path / "results" / name
    rc = main(["sql", str(train_path), TOP_KERNELS, "-o", str(target)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out == ""
    assert_frame_equal(read(target), query(train, TOP_KERNELS))
    assert [p.name for p in target.parent.iterdir()] == [name], "temporary files left behind"


def test_parquet_keeps_types_and_every_row(train_path, train, tmp_path, capsys):
    target = tmp_path / "kernels.pq"
    assert main(["sql", str(train_path), "SELECT * FROM hot_kernels", "-f", "parquet", "-o", str(target)]) == 0
    got, want = pl.read_parquet(target), tables(train)["hot_kernels"]
    assert got.schema == want.schema
    assert_frame_equal(_comparable("hot_kernels", got), _comparable("hot_kernels", want))
    assert main(["sql", str(train_path), "SELECT * FROM gpu", "-o", str(tmp_path / "gpu.parquet")]) == 0
    assert pl.read_parquet(tmp_path / "gpu.parquet").height == train.gpu.height > 50


def test_parquet_needs_an_output_file(train_path, capsys):
    assert main(["sql", str(train_path), TOP_KERNELS, "-f", "parquet"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "-o" in _one_error_line(err)


def test_unknown_suffix_asks_for_a_format(train_path, tmp_path, capsys):
    assert main(["sql", str(train_path), TOP_KERNELS, "-o", str(tmp_path / "out.xlsx")]) == 2
    assert "-f" in _one_error_line(capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []


def test_failed_query_leaves_the_old_output_alone(train_path, tmp_path, capsys):
    target = tmp_path / "out.csv"
    target.write_text("old\n")
    assert main(["sql", str(train_path), "SELECT nope FROM gpu", "-o", str(target)]) == 2
    _one_error_line(capsys.readouterr().err)
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"]


def test_failed_write_removes_its_temporary_file(train_path, tmp_path, capsys, monkeypatch):
    target = tmp_path / "out.parquet"
    target.write_bytes(b"old")

    def broken(self, path, *args, **kwargs):
        Path(path).write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(pl.DataFrame, "write_parquet", broken)
    assert main(["sql", str(train_path), TOP_KERNELS, "-o", str(target)]) == 2
    assert "disk full" in _one_error_line(capsys.readouterr().err)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.parquet"]


def test_refuses_to_overwrite_the_trace(train_path, tmp_path, capsys, copy_trace):
    trace = copy_trace(train_path, tmp_path)
    size = trace.stat().st_size
    assert main(["sql", str(trace), TOP_KERNELS, "-f", "csv", "-o", str(trace)]) == 2
    _one_error_line(capsys.readouterr().err)
    assert trace.stat().st_size == size


@pytest.mark.parametrize(
    "sql",
    [
        "SELEC * FROM gpu",
        "SELECT * FROM no_such_table",
        "SELECT * FROM read_csv('/etc/passwd')",
        "COPY gpu TO 'gpu.csv'",
    ],
)
def test_refused_sql_is_one_line_and_exit_2(train_path, tmp_path, monkeypatch, capsys, sql):
    monkeypatch.chdir(tmp_path)
    assert main(["sql", str(train_path), sql]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    _one_error_line(err)
    assert list(tmp_path.iterdir()) == []


def test_missing_query_is_a_usage_error(train_path, capsys):
    assert main(["sql", str(train_path)]) == 2
    assert "--tables" in _one_error_line(capsys.readouterr().err)


def test_missing_trace_is_one_line(tmp_path, capsys):
    assert main(["sql", str(tmp_path / "nope.json"), "SELECT 1"]) == 2
    assert "nope.json" in _one_error_line(capsys.readouterr().err)


def test_tables_lists_every_table_and_column(train_path, train, capsys):
    assert main(["sql", str(train_path), "--tables"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    heads = [line.split(" ", 1)[0] for line in out.splitlines() if line and not line.startswith(" ")]
    assert heads == list(TABLES)
    for name, df in tables(train).items():
        block = out[out.index(f"\n{name} (") if name != "gpu" else 0:]
        block = block.split("\n\n", 1)[0]
        assert f"({df.height} row" in block
        assert TABLES[name] in block
        for column in df.columns:
            assert re.search(rf"(?<![\w]){re.escape(column)} [A-Z]", block), (name, column)


def test_tables_without_a_trace_and_as_json(train, capsys):
    assert main(["sql", "--tables"]) == 0
    out = capsys.readouterr().out
    assert "rows" not in out.splitlines()[0]
    assert main(["sql", "--tables", "-f", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    listed = {(d["table"], d["column"]) for d in doc}
    # a trace's tables, then a job's (proflab sql RUN_DIR) with their fixed columns
    from proflab.sql import job_tables

    assert listed == {(name, c) for name, df in tables(train).items() for c in df.columns} | {
        (name, c) for name, df in job_tables(None).items() for c in df.columns
    }


def test_readme_tables_and_examples_are_accurate(train_path, capsys):
    """Every key column the documentation names exists, and its example queries run."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## SQL over any trace"):]
    end = section.find("\n## ", 1)
    section = section if end < 0 else section[:end]
    cat = catalog()
    columns = {t: set(cat.filter(pl.col("table") == t)["column"]) for t in TABLES}
    documented = set()
    for table, keys in re.findall(r"^\| `(\w+)` \| [^|]+ \| (.+) \|$", section, flags=re.MULTILINE):
        documented.add(table)
        names = re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", keys))
        assert names and set(names) <= columns[table], (table, set(names) - columns[table])
    assert documented == set(TABLES)
    examples = re.findall(r'^proflab sql \S+ "(.*?)"$', section, flags=re.MULTILINE | re.DOTALL)
    assert len(examples) >= 2
    for sql in examples:
        assert main(["sql", str(train_path), sql, "-f", "csv"]) == 0, capsys.readouterr().err
        assert pl.read_csv(io.StringIO(capsys.readouterr().out)).height > 0


# -- as a process ------------------------------------------------------------------------------------


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "proflab", *args], check=False, capture_output=True, text=True, timeout=120, cwd=cwd)


def test_process_output_is_clean(train_path, train, tmp_path):
    """Nothing on stderr: no warnings from the database library at exit."""
    r = _run(["sql", str(train_path), "SELECT kind, count(*) AS n FROM gpu GROUP BY kind ORDER BY kind", "-f", "csv"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    want = _plain(train.gpu).group_by("kind").agg(pl.len().cast(pl.Int64).alias("n")).sort("kind")
    assert_frame_equal(pl.read_csv(io.StringIO(r.stdout)), want)


def test_process_bad_sql(train_path, tmp_path):
    r = _run(["sql", str(train_path), "SELECT * FROM read_csv('/etc/passwd')"], tmp_path)
    assert r.returncode == 2
    assert r.stdout == ""
    _one_error_line(r.stderr)


def test_help_does_not_import_the_database(tmp_path):
    code = "import sys; from proflab.cli import main\ntry:\n    main(['sql', '--help'])\nexcept SystemExit:\n    pass\nprint('duckdb' in sys.modules, 'polars' in sys.modules, file=sys.stderr)"
    r = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert "proflab sql" in r.stdout
    assert r.stderr.strip() == "False False"
