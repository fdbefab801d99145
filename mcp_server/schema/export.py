"""Write the JSON Schemas of the files the tool produces into schemas/ (run: python -m mcp_server.schema.export)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pydantic import BaseModel

from mcp_server.schema.analysis import Analysis
from mcp_server.schema.loop import LoopState
from mcp_server.schema.manifest import RunManifest
from mcp_server.schema.memory import MemoryProfile
from mcp_server.schema.optimizations import OptimizationPlan
from mcp_server.schema.profile import OperatorAttributedProfile
from mcp_server.schema.proof import BenchResult, Comparison, ValidationReport

SCHEMAS: dict[str, type[BaseModel]] = {
    "profile.schema.json": OperatorAttributedProfile,
    "manifest.schema.json": RunManifest,
    "comparison.schema.json": Comparison,
    "bench.schema.json": BenchResult,
    "validation_report.schema.json": ValidationReport,
    "analysis.schema.json": Analysis,
    "optimizations.schema.json": OptimizationPlan,
    "loop_state.schema.json": LoopState,
    "memory.schema.json": MemoryProfile,
}


def schema_text(model: type[BaseModel]) -> str:
    """The model's JSON Schema as stable, indented text."""
    return json.dumps(model.model_json_schema(), indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write every schema into the folder given (default: ./schemas)."""
    parser = argparse.ArgumentParser(prog="python -m mcp_server.schema.export",
                                     description="Write the JSON Schemas of every file the engine writes.")
    parser.add_argument("folder", nargs="?", type=Path, default=Path("schemas"), help="default: ./schemas")
    out = parser.parse_args(argv).folder
    out.mkdir(parents=True, exist_ok=True)
    for name, model in SCHEMAS.items():
        (out / name).write_text(schema_text(model), encoding="utf-8")
        print(out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
