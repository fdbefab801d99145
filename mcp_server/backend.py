"""What a profiler backend is: the one object that says what it needs on this machine, which passes it plans,
how preflight checks it, and how its run directory assembles.

The objects live in their adapters (`mcp_server/backends/nsys.py`, `mcp_server/backends/torch_profiler.py`), which
also run their main pass (capture's `CapturingBackend` adds that half), and are listed, in the order `--backend auto`
prefers them, in `mcp_server.backends.registry.REGISTRY`. Capture, preflight, assemble and the faces read them there;
none of them branches on a backend's name.
"""

from __future__ import annotations

from typing import Protocol

from mcp_server.rundir import RunDir
from mcp_server.schema.manifest import RunManifest
from mcp_server.schema.profile import OperatorAttributedProfile
from mcp_server.schema.results import PreflightCheck
from mcp_server.schema.types import CaptureBackend, PassName


class Backend(Protocol):
    """A profiler backend, as capture, preflight, assemble and the faces see it."""

    @property
    def name(self) -> str:
        """What `--backend` (and the MCP `backend` parameter) calls it."""
        ...

    @property
    def title(self) -> str:
        """How progress lines name it (`nsys timeline`)."""
        ...

    @property
    def label(self) -> CaptureBackend:
        """What the manifest's `backend` says a run directory it captured holds."""
        ...

    @property
    def profile_tool(self) -> str:
        """What the profiles it assembles say made them (`capture_metadata.tool`, before any `+ncu`)."""
        ...

    @property
    def main_pass(self) -> PassName:
        """The pass that records the window's operators and kernels (also its folder in the run directory)."""
        ...

    @property
    def counters(self) -> bool:
        """Whether ncu's counter pass (and its shape variants') may follow the main pass."""
        ...

    @property
    def records_graph_captures(self) -> bool:
        """Whether the main pass records the CUDA graphs the workload captures itself, with their ranges."""
        ...

    @property
    def remedy(self) -> str:
        """What to do when `missing()` lists something."""
        ...

    @property
    def preflight_needs(self) -> tuple[str, ...]:
        """The preflight facts (check names, and `cuda`) that must hold for `auto` to choose it there."""
        ...

    @property
    def required_checks(self) -> tuple[str, ...]:
        """The preflight checks, beyond the interpreter's, that fail preflight when it is the backend chosen."""
        ...

    @property
    def preflight_line(self) -> str:
        """Preflight's last line when `auto` chooses it."""
        ...

    def missing(self) -> list[str]:
        """What this machine lacks for it (empty: it can run here)."""
        ...

    def tools(self) -> dict[str, str | None]:
        """The external tools it runs, by name, with their paths here (None: not found); the manifest records
        their versions."""
        ...

    def tool_checks(self, quick: bool) -> list[PreflightCheck]:
        """Preflight's checks of its external tools (`quick`: no version queries)."""
        ...

    def assemble(self, run_dir: RunDir, manifest: RunManifest) -> OperatorAttributedProfile:
        """The profile of a run directory whose manifest holds its main pass."""
        ...
