"""Every report proflab writes validates against the published JSON Schema."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import jsonschema
import pytest

import proflab
from proflab.cli import main

KINETO = Path(__file__).parent / "data" / "kineto"
from shared_fixtures import NSYS  # noqa: E402
TRACES = sorted(KINETO.rglob("*.json.gz")) + (sorted(NSYS.glob("*.sqlite")) if NSYS.exists() else [])


def _validator(name: str):
    schema = json.loads(resources.files("proflab").joinpath(f"schema/{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture(scope="module")
def validator():
    return _validator("report")


@pytest.mark.parametrize("trace", TRACES, ids=[t.name for t in TRACES])
def test_cli_json_validates(trace, validator, capsys):
    assert main(["analyze", str(trace), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # an Nsight Systems export of a whole job (one process per GPU) is a job report, whose
    # ranks' reports are reports
    docs = [doc]
    if doc["schema"] == "proflab.job/1":
        errors = list(_validator("job").iter_errors(doc))
        assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:5]]
        docs = doc["reports"]
    for d in docs:
        errors = sorted(validator.iter_errors(d), key=lambda e: list(e.path))
        assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:5]]
        gains = [f["est_gain_ms"] for f in d["findings"]]
        assert gains == sorted(gains, reverse=True)


def test_schema_rejects_a_broken_report(validator):
    """The schema is strict enough to catch a contract break (so the test above can fail)."""
    doc = proflab.analyze(TRACES[0]).to_dict()
    doc["findings"] = [{"id": "x", "category": "not_a_category", "severity": "loud"}]
    assert list(validator.iter_errors(doc))
