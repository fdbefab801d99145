"""The torch.profiler backend's adapter: its main pass (Kineto's trace, once per process or per rank) and its
assembler (`mcp_server.assemble.torch_profiler`); it needs nothing beyond torch."""

from __future__ import annotations

from dataclasses import dataclass

from mcp_server.assemble.torch_profiler import assemble_torch
from mcp_server.capture.passes import Cancel, torch_pass
from mcp_server.capture.request import CaptureRequest
from mcp_server.capture.torchrun import torch_ranks
from mcp_server.progress import Progress
from mcp_server.rundir import RunDir
from mcp_server.schema.manifest import PassRecord, RunManifest
from mcp_server.schema.profile import OperatorAttributedProfile
from mcp_server.schema.results import PreflightCheck
from mcp_server.schema.types import CaptureBackend, PassName


@dataclass(frozen=True)
class TorchProfilerBackend:
    """The torch.profiler backend: Kineto's trace, on any machine torch runs on (CPU operator times without a
    CUDA GPU)."""

    name: str = "torch"
    title: str = "torch.profiler (Kineto)"
    label: CaptureBackend = "torch"
    profile_tool: str = "torch_profiler"
    main_pass: PassName = "torch"
    counters: bool = False
    records_graph_captures: bool = False
    remedy: str = "install torch in the workload's environment"
    preflight_needs: tuple[str, ...] = ()
    required_checks: tuple[str, ...] = ()
    preflight_line: str = ("backend auto -> torch.profiler: operator times (CPU operators without a CUDA GPU); "
                           "`[info]` lines say what the GPU path would need")

    def missing(self) -> list[str]:
        """Nothing: torch.profiler ships with torch, which every workload imports."""
        return []

    def tools(self) -> dict[str, str | None]:
        """None: the profiler runs inside the workload's process."""
        return {}

    def tool_checks(self, quick: bool) -> list[PreflightCheck]:
        """None: preflight's torch check is this backend's."""
        return []

    def run_main(self, req: CaptureRequest, progress: Progress, cancel: Cancel) -> PassRecord:
        """The torch.profiler pass."""
        return torch_pass(req, progress, cancel)

    def run_ranks(self, req: CaptureRequest, ranks: list[int], progress: Progress,
                  cancel: Cancel) -> dict[int, PassRecord]:
        """The torch.profiler pass on every rank."""
        return torch_ranks(req, ranks, progress, cancel)

    def assemble(self, run_dir: RunDir, manifest: RunManifest) -> OperatorAttributedProfile:
        """The torch pass's Kineto trace."""
        return assemble_torch(run_dir, manifest)


TORCH_PROFILER = TorchProfilerBackend()
