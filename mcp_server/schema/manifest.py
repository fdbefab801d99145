"""The run directory's manifest.json: what was run, with which tools and options, and which artifacts it left."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mcp_server.schema.requests import NcuOptions
from mcp_server.schema.types import CaptureBackend, CompileMode, PassName, RunMode

MANIFEST_VERSION = "1.3"


class PassRecord(BaseModel):
    """One child-process run of the harness, possibly under a profiler tool."""

    model_config = ConfigDict(extra="forbid")

    name: PassName = Field(description="A backend's main pass ('nsys', 'torch'), or a pass every backend may plan: "
                           "'timing', 'ncu', 'ncu_variants', 'memory'.")
    profiler: str = Field(description="What the harness did in its window: torch, nvtx or none.")
    command: list[str]
    attach_command: list[str] | None = Field(
        default=None,
        description="For a pass whose workload `command` started suspended (`ncu --mode launch`): the ncu "
        "command that attached to it, with what it replayed and collected.",
    )
    ncu: NcuOptions | None = Field(
        default=None, description="For an ncu pass: what it replayed and collected, as asked (the replay filter "
        "of a shape-variant pass included)."
    )
    replayed_launches: list[int] | None = Field(
        default=None, description="For a shape-variant pass that profiled only chosen module calls: the window "
        "launches (ordinals) it replayed, in order.",
    )
    directory: str = Field(description="Sub-directory of the run directory holding this pass's artifacts.")
    started_at: str
    wall_time_s: float
    exit_code: int
    artifacts: list[str] = Field(default_factory=list, description="Paths relative to the run directory.")
    notes: list[str] = Field(default_factory=list)
    stopped_processes: list[str] = Field(
        default_factory=list, description="Processes the pass's child left running outside its process group (a "
        "daemon in a session of its own), found by the run's tag and stopped: `pid (command line)`.",
    )
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
    backend: CaptureBackend = Field(description="The label of the backend that captured it ('nsys+ncu', 'torch'), or "
                                    "'memory' (the memory pass alone).")
    compile_mode: CompileMode
    run_mode: RunMode
    warmup_iters: int
    iters: int
    seed: int
    command_line: list[str]
    tool_versions: dict[str, str] = Field(default_factory=dict)
    gpu: dict[str, str] = Field(default_factory=dict, description="nvidia-smi's view: name, driver, clocks.")
    passes: list[PassRecord] = Field(default_factory=list)
    distributed: dict[str, Any] | None = Field(
        default=None, description="A multi-rank run: the torchrun launch (nproc_per_node, nnodes, ...), and for one "
        "rank's manifest its `rank`; None for one process.")
    notes: list[str] = Field(default_factory=list, description="What the run did beside its passes (e.g. the "
                             "bytecode it compiled for them).")

    def pass_named(self, name: PassName) -> PassRecord | None:
        """The pass called `name`, if the run has one."""
        return next((p for p in self.passes if p.name == name), None)

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        """A 1.0 manifest (before ncu options were recorded) gets its ncu passes' options from their commands; a
        1.1 manifest (before `notes`) or a 1.2 one (before passes' `stopped_processes`) needs nothing more."""
        if isinstance(data, dict) and data.get("manifest_version") in ("1.1", "1.2"):
            data = {**data, "manifest_version": MANIFEST_VERSION}
        if isinstance(data, dict) and data.get("manifest_version") == "1.0":
            data = {**data, "manifest_version": MANIFEST_VERSION, "passes": [
                {**p, "ncu": _options_of_v1_command(p.get("attach_command") or p.get("command") or [])}
                if isinstance(p, dict) and str(p.get("name", "")).startswith("ncu") and "ncu" not in p else p
                for p in data.get("passes", [])
            ]}
        return data


def _options_of_v1_command(command: list[str]) -> dict[str, Any]:
    """The replay options an ncu command line of a version 1.0 manifest asked for (upgrading it; new manifests
    record them as data)."""
    values = dict(zip(command, command[1:], strict=False))
    count = values.get("--launch-count")
    per_config = values.get("--filter-mode") == "per-launch-config"
    options: dict[str, Any] = {
        "dedupe": per_config,
        "kernel_regex": values["--kernel-name"].removeprefix("regex:") if "--kernel-name" in values else None,
        "launch_skip": int(values["--launch-skip"]) if "--launch-skip" in values else None,
        "launch_count": int(count) if count is not None and not per_config else None,
        "metric_set": values.get("--set"),
        "sections": tuple(v for f, v in zip(command, command[1:], strict=False) if f == "--section"),
        "ncu_sudo": command[:2] == ["sudo", "-n"],
    }
    return options


class RunOwner(BaseModel):
    """What a run directory's lock file (`.run.lock`) holds while a run writes the directory: the engine process
    and the tag its children carry. Cleared when the run ends; a record still there when the next run takes the
    lock is a run that was stopped before it finished (its engine killed)."""

    model_config = ConfigDict(extra="forbid")

    pid: int = Field(description="The engine process that held the run directory.")
    tag: str = Field(description="The start of every run tag its children carried (RUN_TAG_ENV).")
    verb: str = Field(description="What it was doing: profile, map or assemble.")
    started_at: str
