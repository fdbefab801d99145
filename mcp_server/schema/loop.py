"""loop_state.json: which engine tool wrote each checkpoint file of an optimization loop's folder, and from what.

The `/optimize` loop keeps its state in the files of the workload's folder. The tools that write a checkpoint
there (analyze, compare, bench, validate, report) record it here: when, its sha256, and the sha256 of every file
it was computed from, so that `loop_status` can tell a checkpoint whose inputs changed from one that is current
without comparing modification times. Files the agents write (profile.json, optimizations.json, the optimized
workload, its test, profile_optimized.json) have no record.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from mcp_server.schema.types import LoopTool

LOOP_STATE_VERSION = "1.0"
LOOP_STATE_JSON = "loop_state.json"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputRecord(_Model):
    """One file a checkpoint was computed from, as it was when the tool read it."""

    path: str = Field(description="Its name when it lies in the loop folder (e.g. 'profile.json'), else its "
                      "absolute path.")
    sha256: str


class CheckpointRecord(_Model):
    """One checkpoint file as the tool that wrote it left it."""

    file: str = Field(description="The checkpoint's name in the loop folder, e.g. 'analysis.json'.")
    tool: LoopTool = Field(description="The engine tool that wrote it.")
    written_at: str = Field(description="When it was recorded (ISO 8601, UTC).")
    sha256: str = Field(description="The file's sha256 as written: a file that differs was rewritten since.")
    inputs: list[InputRecord] = Field(default_factory=list, description="The files it was computed from.")


class LoopState(_Model):
    """loop_state.json: the latest record of each checkpoint an engine tool wrote into the loop folder."""

    loop_state_version: str = LOOP_STATE_VERSION
    checkpoints: dict[str, CheckpointRecord] = Field(
        default_factory=dict, description="By checkpoint file name; a tool writing the file again replaces its record."
    )
