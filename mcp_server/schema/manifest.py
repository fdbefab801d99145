"""The run directory's manifest.json: what was run, with which tools, and which artifacts it left."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MANIFEST_VERSION = "1.0"


class PassRecord(BaseModel):
    """One child-process run of the harness, possibly under a profiler tool."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="'torch', 'nsys', 'ncu' or 'timing'.")
    profiler: str = Field(description="What the harness did in its window: torch, nvtx or none.")
    command: list[str]
    attach_command: list[str] | None = Field(
        default=None,
        description="For a pass whose workload `command` started suspended (`ncu --mode launch`): the ncu "
        "command that attached to it, with what it replayed and collected.",
    )
    directory: str = Field(description="Sub-directory of the run directory holding this pass's artifacts.")
    started_at: str
    wall_time_s: float
    exit_code: int
    artifacts: list[str] = Field(default_factory=list, description="Paths relative to the run directory.")
    notes: list[str] = Field(default_factory=list)
    stopped_early: Literal["timeout", "condition"] | None = Field(
        default=None,
        description="Set when the pass was stopped before its window finished and kept what it gathered: "
        "'timeout' (its time limit) or 'condition' (e.g. ncu's --max-kernels reached).",
    )


class RunManifest(BaseModel):
    """manifest.json: everything later stages need to rebuild profile.json from files alone."""

    model_config = ConfigDict(extra="forbid")

    manifest_version: str = MANIFEST_VERSION
    created_at: str
    workload: str
    python: str
    backend: str = Field(description="'torch' or 'nsys+ncu'.")
    compile_mode: str
    run_mode: str
    warmup_iters: int
    iters: int
    seed: int
    command_line: list[str]
    tool_versions: dict[str, str] = Field(default_factory=dict)
    gpu: dict[str, str] = Field(default_factory=dict, description="nvidia-smi's view: name, driver, clocks.")
    passes: list[PassRecord] = Field(default_factory=list)
