"""Intermediate records the profiler-tool adapters (plugins/) produce and the attribution stage consumes.

Every adapter turns its tool's raw output into these: a Kineto trace or an nsys SQLite export into
`TraceKernel`s (timeline, real clocks, with the stack of ranges enclosing each launch), an ncu report into
`CounterRecord`s (hardware counters, replayed at base clocks).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from mcp_server.schema.profile import Metric


class Frame(BaseModel):
    """One range enclosing a kernel launch on the launching CPU thread: an operator, a module or a marker."""

    name: str = Field(description="Bare name: 'aten::addmm', 'features.0.conv' (module) or a marker name.")
    kind: str = Field(description="'op' (a PyTorch operator), 'module' (nn.Module range), 'site' (the user's "
                      "`path:line` that called torch) or 'annotation'.")
    input_shapes: list[list[int] | None] | None = None
    input_dtypes: list[str | None] | None = None
    start_ns: int | None = None
    end_ns: int | None = None
    seq: int | None = Field(default=None, description="Autograd sequence number the range carries, if any.")


class TraceKernel(BaseModel):
    """One kernel execution from a timeline (Kineto or nsys), in launch order within the window."""

    ordinal: int = Field(description="Launch order within the window (0-based), by runtime-call order.")
    name: str
    mangled_name: str | None = None
    start_ns: int = Field(description="GPU start timestamp, ns (tool clock).")
    duration_ns: int
    device_id: int | None = None
    stream_id: int | None = None
    correlation_id: int | None = None
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    registers_per_thread: int | None = None
    shared_memory_bytes: int | None = None
    launch_thread: int | None = None
    launch_start_ns: int | None = Field(default=None, description="CPU start of the launching runtime call, ns.")
    stack: list[Frame] = Field(default_factory=list, description="Enclosing ranges, outermost first.")
    linked_op: str | None = Field(
        default=None, description="Operator the tool itself correlated to the launch (Kineto External id)."
    )
    from_graph: bool = Field(default=False, description="Replayed from a CUDA graph (nsys' graph node id).")


class CounterRecord(BaseModel):
    """One profiled kernel from Nsight Compute, in profiling (= launch) order."""

    ordinal: int
    name: str
    mangled_name: str | None = None
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    stream: int | None = Field(default=None, description="CUDA stream id of the launch (ncu's launch__stream_id).")
    metrics: dict[str, Metric] = Field(default_factory=dict)
    stack: list[Frame] = Field(default_factory=list, description="NVTX push/pop stack at launch, outermost first.")


class CpuOp(BaseModel):
    """A top-level CPU operator call (CPU-only profiles)."""

    name: str
    start_ns: int
    duration_ns: int
    self_ns: int
    thread: int | None = None
    stack: list[Frame] = Field(default_factory=list)
    input_shapes: list[list[int] | None] | None = None
    input_dtypes: list[str | None] | None = None
    seq: int | None = Field(default=None, description="The call's autograd sequence number (grad mode was on).")
    nested_self_ns: dict[str, int] = Field(
        default_factory=dict, description="Self time of this call and of every operator it called, by name."
    )


RuntimeKind = Literal["sync", "memcpy", "memset"]


class RuntimeCall(BaseModel):
    """One CUDA API call of the window that synchronises the host with the GPU or copies or sets memory, with the
    GPU activity it started (a Kineto trace or an nsys export), in call order."""

    ordinal: int = Field(description="Order of the call within the window (0-based), by its host start.")
    kind: RuntimeKind = Field(description="'memcpy' or 'memset' (the call starts one), else 'sync'.")
    api: str = Field(description="The API's name without its version suffix, e.g. cudaStreamSynchronize.")
    api_start_ns: int = Field(description="Host start of the call, ns (tool clock).")
    api_end_ns: int
    thread: int | None = None
    correlation_id: int | None = None
    synchronizing: bool = Field(default=False, description="The host waits in the call until the GPU work before "
                                "it (or the copy itself) is done.")
    gpu_start_ns: int | None = Field(default=None, description="The copy's or set's start on the GPU, ns.")
    gpu_end_ns: int | None = None
    bytes: int | None = None
    copy_kind: str | None = Field(default=None, description="HtoD, DtoH, DtoD, HtoH, PtoP, ... (copies).")
    src_memory: str | None = Field(default=None, description="pageable, pinned, device, managed, array.")
    dst_memory: str | None = None
    sync_type: str | None = Field(default=None, description="CUPTI's record of the wait: stream, event, context.")
    stack: list[Frame] = Field(default_factory=list, description="Ranges enclosing the call, outermost first.")
