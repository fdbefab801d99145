"""Schema v1 of OperatorAttributedProfile: round trip, published JSON Schema, version and corruption errors."""

from __future__ import annotations

import json

import jsonschema
import pytest
from conftest import REPO

from mcp_server.errors import ProfileFormatError
from mcp_server.schema.export import SCHEMAS, schema_text
from mcp_server.schema.io import load_profile, write_model_atomic
from mcp_server.schema.profile import (
    Attribution,
    AttributionMethod,
    CaptureMetadata,
    Confidence,
    KernelRecord,
    Metric,
    OperatorAttributedProfile,
    OperatorRecord,
    WindowTotals,
)


def _profile() -> OperatorAttributedProfile:
    kernel = KernelRecord(
        kernel_id=0, kernel_name="sgemm", start_ns=10, duration_ns=2_000,
        attribution=Attribution(method=AttributionMethod.KINETO_CORRELATION, confidence=Confidence.HIGH,
                                launch_op="aten::addmm"),
        metrics={"dram_bytes_read": Metric(value=4096.0, unit="byte")},
    )
    meta = CaptureMetadata(
        tool="torch_profiler", gpu_used=True, device_name="NVIDIA H100 80GB HBM3", device_type="cuda", sm_count=132,
        torch_version="2.11.0", python_version="3.12.3", python_executable="/usr/bin/python3", workload="w.py",
        compile_mode="eager", run_mode="inference", warmup_iters=3, iters=1, seed=0,
        command_line=["operator-profiler", "profile", "w.py"], started_at="2026-11-21T00:00:00+00:00",
        finished_at="2026-11-21T00:00:01+00:00",
    )
    op = OperatorRecord(operator_id="aten::linear#0", operator_name="aten::linear", call_index=0,
                        module_path="fc", input_shapes=[[4, 8], [16, 8], [16]], kernels=[kernel])
    return OperatorAttributedProfile(capture_metadata=meta, window=WindowTotals(wall_time_ns=5_000), operators=[op])


def test_round_trip(tmp_path):
    path = tmp_path / "profile.json"
    write_model_atomic(path, _profile())
    loaded = load_profile(path)
    assert loaded == _profile()
    assert loaded.operators[0].kernels[0].metrics["dram_bytes_read"].unit == "byte"
    assert not list(tmp_path.glob(".*.tmp")), "atomic write left a temporary file"


def test_profile_validates_against_published_schema(tmp_path):
    published = json.loads((REPO / "schemas" / "profile.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(published)
    jsonschema.validate(json.loads(_profile().model_dump_json()), published)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_published_schemas_are_current(name):
    assert (REPO / "schemas" / name).read_text() == schema_text(SCHEMAS[name]), (
        "schemas/ is stale: run `python -m mcp_server.schema.export`"
    )


def test_other_major_version_is_refused(tmp_path):
    data = json.loads(_profile().model_dump_json())
    data["schema_version"] = "2.0"
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileFormatError, match="schema version 2.0"):
        load_profile(path)


def test_minor_version_is_accepted(tmp_path):
    data = json.loads(_profile().model_dump_json())
    data["schema_version"] = "1.7"
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    assert load_profile(path).schema_version == "1.7"


@pytest.mark.parametrize("content", ["{not json", "[]", '{"schema_version": "1.0", "operators": 3}'])
def test_corrupt_profile_is_refused(tmp_path, content):
    path = tmp_path / "profile.json"
    path.write_text(content)
    with pytest.raises(ProfileFormatError) as err:
        load_profile(path)
    assert err.value.remedy
