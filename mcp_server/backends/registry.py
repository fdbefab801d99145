"""The profiler backends, in the order `--backend auto` prefers them: the one place a backend is plugged in.

A new backend is one adapter (an object with the capture side's `CapturingBackend` protocol, in this package, whose
main pass and assembler sit in `capture` and `assemble`) and one entry here; `auto`, preflight, capture, assemble and
the faces read this mapping. The schema names no backend: what `--backend` accepts, what a manifest's label and a
pass folder may be, is what this mapping holds.
"""

from __future__ import annotations

from mcp_server.assemble import assemble_with
from mcp_server.backends.nsys import NSYS
from mcp_server.backends.torch_profiler import TORCH_PROFILER
from mcp_server.capture.passes import CapturingBackend
from mcp_server.errors import BackendUnavailable, ProfileFormatError
from mcp_server.rundir import RunDir
from mcp_server.schema.manifest import RunManifest
from mcp_server.schema.profile import OperatorAttributedProfile

AUTO = "auto"  # the choice that takes the first backend this machine has everything for

REGISTRY: dict[str, CapturingBackend] = {backend.name: backend for backend in (NSYS, TORCH_PROFILER)}


def backend_choices() -> tuple[str, ...]:
    """What `--backend` (and the MCP `backend` parameter) accepts: `auto`, then each backend by preference."""
    return (AUTO, *REGISTRY)


def pass_folders() -> frozenset[str]:
    """The run-directory folders of the backends' main passes (a run directory holds these besides the shared
    passes' folders)."""
    return frozenset(backend.main_pass for backend in REGISTRY.values())


def choose_backend(requested: str) -> CapturingBackend:
    """The backend a capture runs: for `auto` the first one whose needs this machine meets; a named one when it
    does (BackendUnavailable, naming what is missing, when not)."""
    if requested == AUTO:
        for backend in REGISTRY.values():
            if not backend.missing():
                return backend
        raise BackendUnavailable("no profiler backend can run here", "install torch in the workload's environment")
    named = REGISTRY.get(requested)
    if named is None:
        raise BackendUnavailable(f"unknown backend {requested!r}", f"choose one of {', '.join(backend_choices())}")
    missing = named.missing()
    if missing:
        raise BackendUnavailable(f"backend {named.name} needs {', '.join(missing)}, not found here", named.remedy)
    return named


def captured_by(manifest: RunManifest) -> CapturingBackend:
    """The backend whose main pass a run directory's manifest holds (ProfileFormatError when none does)."""
    for backend in REGISTRY.values():
        if manifest.pass_named(backend.main_pass) is not None:
            return backend
    raise ProfileFormatError("the run directory holds no capture pass", "re-run `operator-profiler profile`")


def assemble(run_dir: RunDir) -> OperatorAttributedProfile:
    """Rebuild the profile of a run directory from its manifest and raw artifacts, by the backend that captured it."""
    manifest = run_dir.read_manifest()
    try:
        backend = captured_by(manifest)
    except ProfileFormatError as exc:
        raise ProfileFormatError(f"{run_dir.path} holds no capture pass", exc.remedy) from None
    return assemble_with(run_dir, manifest, backend)
