"""The nsys + ncu backend's adapter: what it needs, its main pass (nsys's timeline, once per process or per rank),
preflight's checks of its tools and its assembler (`mcp_server.assemble.nsys`)."""

from __future__ import annotations

from dataclasses import dataclass

from mcp_server.assemble.nsys import assemble_nsys
from mcp_server.capture.passes import Cancel, nsys_pass
from mcp_server.capture.request import CaptureRequest
from mcp_server.capture.torchrun import nsys_ranks
from mcp_server.progress import Progress
from mcp_server.rundir import RunDir
from mcp_server.schema.manifest import PassRecord, RunManifest
from mcp_server.schema.profile import OperatorAttributedProfile
from mcp_server.schema.results import PreflightCheck
from mcp_server.schema.types import CaptureBackend, PassName
from plugins.executables import has_gpu, tool_version
from plugins.ncu.command import find_ncu
from plugins.nsys.command import find_nsys, importer_problems


def _tool_check(name: str, product: str, path: str | None, env: str, quick: bool) -> PreflightCheck:
    """Preflight's check of one Nsight tool: found, its version (not when `quick`), and (nsys) its importer."""
    if path is None:
        return PreflightCheck(name=name, ok=False, detail="not found",
                              remedy=f"install {product} or set {env}=/path/to/{name}")
    version = None if quick else tool_version(path)
    problems = importer_problems(path) if name == "nsys" else []
    if problems:
        return PreflightCheck(name=name, ok=False, detail=f"{path}: cannot write reports, missing {problems}",
                              remedy="install the missing libraries (e.g. libdw1) or a full Nsight Systems")
    return PreflightCheck(name=name, ok=True, detail=f"{path}" + (f" ({version})" if version else ""))


@dataclass(frozen=True)
class NsysBackend:
    """The nsys + ncu backend: nsys's timeline (real clocks, NVTX stacks), ncu's counters once asked for."""

    name: str = "nsys"
    title: str = "nsys timeline"
    label: CaptureBackend = "nsys+ncu"
    profile_tool: str = "nsys"
    main_pass: PassName = "nsys"
    counters: bool = True
    records_graph_captures: bool = True
    remedy: str = "use --backend torch, or install Nsight Systems/Compute (set NSYS=/NCU= to their paths)"
    preflight_needs: tuple[str, ...] = ("gpu", "cuda", "nsys", "ncu")
    required_checks: tuple[str, ...] = ("gpu", "torch CUDA", "nsys", "ncu", "counter permission")
    preflight_line: str = "backend auto -> nsys + ncu"

    def missing(self) -> list[str]:
        """An NVIDIA GPU, nsys and ncu: those not found here."""
        found = (("an NVIDIA GPU (nvidia-smi)", has_gpu()), *((n, p is not None) for n, p in self.tools().items()))
        return [name for name, ok in found if not ok]

    def tools(self) -> dict[str, str | None]:
        """nsys and ncu, where found."""
        return {"nsys": find_nsys(), "ncu": find_ncu()}

    def tool_checks(self, quick: bool) -> list[PreflightCheck]:
        """nsys's and ncu's checks."""
        tools = self.tools()
        return [_tool_check("nsys", "Nsight Systems", tools["nsys"], "NSYS", quick),
                _tool_check("ncu", "Nsight Compute", tools["ncu"], "NCU", quick)]

    def run_main(self, req: CaptureRequest, progress: Progress, cancel: Cancel) -> PassRecord:
        """The nsys pass, its report exported to SQLite."""
        return nsys_pass(req, progress, cancel)

    def run_ranks(self, req: CaptureRequest, ranks: list[int], progress: Progress,
                  cancel: Cancel) -> dict[int, PassRecord]:
        """The nsys pass on every rank, each rank's report exported."""
        return nsys_ranks(req, ranks, progress, cancel)

    def assemble(self, run_dir: RunDir, manifest: RunManifest) -> OperatorAttributedProfile:
        """The nsys pass's timeline joined with the ncu pass's counters."""
        return assemble_nsys(run_dir, manifest)


NSYS = NsysBackend()
