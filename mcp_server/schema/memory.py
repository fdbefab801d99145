"""memory.json: where every byte at the peak of the measured window comes from, and the record the memory pass's
harness writes beside the allocator's snapshots (`memory_record.json`), which memory.json is rebuilt from."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from mcp_server.schema.profile import Phase
from mcp_server.schema.types import CompileMode, RunMode

MEMORY_VERSION = "1.0"

MemoryCategory = Literal["parameter", "buffer", "gradient", "optimizer_state", "activation", "temporary",
                         "workspace", "input_output", "retained"]
"""What a block of memory holds:
parameter, buffer, gradient, optimizer_state: the model's and optimizer's tensors (found by their storage);
activation: made in a forward pass and freed after it (saved for backward);
temporary: made and freed within one phase;
workspace: scratch of a library call (cuBLAS, cuDNN, attention) freed inside that call, or kept by it (cuBLAS's);
input_output: the window's inputs and the model's outputs;
retained: alive before or after the window and none of the above (a reference held across steps, a cache)."""

MemoryPattern = Literal["activation_checkpointing", "zero_grad_set_to_none", "bf16_activations", "in_place_ops",
                        "references_across_steps", "expandable_segments", "optimizer_state"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------------------------- the harness's record


class MemoryRecord(BaseModel):
    """memory_record.json: what the memory pass's harness saw beside the allocator (times from `time.time_ns()`,
    the clock the allocator's `time_us` is converted to). Names are numbers into `strings` (-1: none)."""

    model_config = ConfigDict(extra="ignore")

    version: int
    device: int = 0
    device_name: str | None = None
    total_memory: int | None = None
    root_module: str | None = None
    compile_mode: CompileMode | None = None
    run_mode: RunMode | None = None
    strings: list[str] = Field(default_factory=list)
    ops: list[tuple[int, int, int, int, int, int, int, int, list[tuple[int, int, int]], list[int]]] = Field(
        default_factory=list, description="[op, start_ns, end_ns, thread, module, phase, call site, autograd node, "
        "outputs: [storage address, bytes, dtype], inputs: [storage address] (outside every module)] per aten call "
        "(eager mode).")
    backward: list[tuple[int, int]] = Field(default_factory=list)
    optimizer: list[tuple[int, int]] = Field(default_factory=list)
    iterations: list[tuple[int, int]] = Field(default_factory=list)
    window: tuple[int, int] | None = None
    start_snapshot_ns: int | None = None
    end_snapshot_ns: int | None = None
    markers: list[tuple[int, int]] = Field(default_factory=list)
    marker_bytes: int | None = None
    identities_start: list[tuple[int, int, int, int, int]] = Field(default_factory=list)
    identities_end: list[tuple[int, int, int, int, int]] = Field(default_factory=list)
    outputs: list[tuple[int, int, int]] = Field(default_factory=list)
    gradients: list[tuple[int, int, int, int, int]] = Field(
        default_factory=list, description="[storage address, bytes, module, name, time_ns] of each gradient at the "
        "start of each optimizer step in the window.")
    stats: dict[str, int] = Field(default_factory=dict)
    library_roots: list[str] = Field(default_factory=list)
    oom: dict[str, int | str | None] | None = None
    cublas_workspaces_cleared: bool | None = None
    history_cleared: bool | None = None
    start_snapshot_s: float | None = None
    end_snapshot_s: float | None = None

    def name(self, index: int) -> str | None:
        """The string numbered `index`, or None."""
        return self.strings[index] if 0 <= index < len(self.strings) else None


# --------------------------------------------------------------------------------------------- memory.json


class MemoryGroup(_Model):
    """Bytes live at a moment under one key (a category, module, operator or call site)."""

    key: str | None = Field(description="The category, module path, operator or file:line; None: unknown.")
    bytes: int
    blocks: int
    share_pct: float = Field(description="Of the bytes live at that moment.")


class MemoryHolder(_Model):
    """Blocks live at a moment that share category, module, operator and call site: one row of the holders."""

    category: MemoryCategory
    module: str | None = None
    operator: str | None = None
    call_site: str | None = None
    phase: Phase | None = Field(default=None, description="The phase that allocated them (None: before the window).")
    bytes: int
    blocks: int
    share_pct: float


class MemoryMoment(_Model):
    """What was live at one moment of the window (its peak, or the failed allocation) and who holds it."""

    offset_us: int = Field(description="Microseconds since the window's start (since the history's start for a "
                           "failure before the window).")
    phase: Phase | None = None
    operator: str | None = Field(default=None, description="The operator call running then.")
    module: str | None = None
    live_bytes: int = Field(description="Bytes of the live blocks (their requests, at the allocator's 512-byte "
                            "granularity, or their block sizes where a snapshot shows them).")
    blocks: int
    attributed_pct: float = Field(description="Share of live_bytes with a module (a parameter, gradient, optimizer "
                                  "state, activation or temporary of a known module).")
    by_category: list[MemoryGroup] = Field(default_factory=list)
    by_module: list[MemoryGroup] = Field(default_factory=list)
    by_operator: list[MemoryGroup] = Field(default_factory=list)
    by_call_site: list[MemoryGroup] = Field(default_factory=list)
    holders: list[MemoryHolder] = Field(default_factory=list, description="Heaviest first.")


class TimelinePoint(_Model):
    """Allocated and reserved bytes at one time of the window (after the event at that time)."""

    offset_us: int
    allocated_bytes: int
    reserved_bytes: int


class PhaseSpan(_Model):
    """One phase of one iteration of the window."""

    phase: Phase
    start_us: int
    end_us: int


class MemoryFinding(_Model):
    """A way to lower the peak, with the evidence that triggered it and an upper-bound estimate of what it saves."""

    pattern: MemoryPattern
    title: str
    saving_bytes: int = Field(description="Upper bound of the bytes the change removes from the peak (an estimate).")
    saving_pct: float = Field(description="saving_bytes as a share of the peak.")
    estimate: str = Field(description="How the upper bound was computed; always labelled an estimate.")
    evidence: list[str] = Field(default_factory=list)
    modules: list[str] = Field(default_factory=list)
    change: str = Field(description="What to change, with the code to write.")


class OomDiagnosis(_Model):
    """The allocation that failed, and what held the memory at that moment."""

    stage: str | None = Field(default=None, description="The harness's phase: build, warmup or measure.")
    requested_bytes: int | None = None
    device_free_bytes: int | None = None
    device_total_bytes: int | None = None
    phase: Phase | None = None
    operator: str | None = None
    module: str | None = None
    call_site: str | None = None
    frames: list[str] = Field(default_factory=list, description="The failed request's Python stack, innermost first.")
    message: str | None = None
    held: MemoryMoment | None = None


class MemoryProfile(_Model):
    """memory.json: the memory pass's window, its peak and who holds it, its timeline, findings, and any failure."""

    memory_version: str = MEMORY_VERSION
    workload: str
    compile_mode: CompileMode
    run_mode: RunMode
    device_name: str | None = None
    device_total_bytes: int | None = None
    window_us: int = Field(description="Length of the recorded window (0 for a failure before it).")
    peak_allocated_bytes: int | None = Field(
        default=None, description="The allocator's own peak of allocated bytes over the window "
        "(torch.cuda.max_memory_allocated after a reset at the window's start).")
    peak_reserved_bytes: int | None = Field(default=None, description="The allocator's peak reserved bytes there.")
    peak_requested_bytes: int | None = Field(default=None, description="The allocator's peak of requested bytes.")
    replayed_peak_bytes: int = Field(description="The peak of the live bytes replayed from the allocator's trace.")
    at_peak: MemoryMoment | None = None
    timeline: list[TimelinePoint] = Field(default_factory=list, description="Downsampled; the peak is kept.")
    phases: list[PhaseSpan] = Field(default_factory=list)
    findings: list[MemoryFinding] = Field(default_factory=list)
    oom: OomDiagnosis | None = None
    trace_entries: int = Field(description="Allocator trace entries replayed.")
    unmatched_frees: int = Field(default=0, description="Frees of blocks the replay never saw allocated.")
    clock_offset_us: int = Field(default=0, description="Correction applied to the allocator's times (from the "
                                 "harness's marker allocations).")
    artifacts: dict[str, str] = Field(default_factory=dict, description="Raw files, relative to the run directory.")
    notes: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
