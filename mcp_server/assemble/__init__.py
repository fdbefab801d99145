"""Assemble: rebuild profile.json from a run directory's raw artifacts alone (no GPU, no workload).

The readers' records are joined (nsys timeline with ncu counters), each kernel attributed to its operator and
module, and the operators aggregated: a profile is a pure function of the run directory's files.
"""

from __future__ import annotations

from pathlib import Path

from mcp_server.assemble.collectives import annotate
from mcp_server.assemble.events import apply_unprofiled_idle
from mcp_server.assemble.metadata import harness_result
from mcp_server.assemble.unprofiled import apply_unprofiled, read_unprofiled
from mcp_server.backend import Backend
from mcp_server.rundir import RunDir
from mcp_server.schema.io import write_model_streaming
from mcp_server.schema.manifest import RunManifest
from mcp_server.schema.profile import OperatorAttributedProfile
from mcp_server.schema.types import COUNTER_PASS, TIMING_PASS
from plugins.bulk import gc_paused


def assemble_with(run_dir: RunDir, manifest: RunManifest, backend: Backend) -> OperatorAttributedProfile:
    """Rebuild the profile of a run directory, captured by `backend`, from its manifest and raw artifacts
    (`mcp_server.backends.registry.assemble` finds the backend in the manifest)."""
    with gc_paused():
        profile, main = backend.assemble(run_dir, manifest), backend.main_pass
        if manifest.distributed is not None:  # one rank of a torchrun launch
            annotate(profile, harness_result(run_dir, main).distributed)
            counters = manifest.pass_named(COUNTER_PASS)
            if profile.capture_metadata.distributed is not None and counters is not None:
                profile.capture_metadata.distributed.ncu_excluded_collectives = any(
                    "NCCL" in note for note in counters.notes)
        if manifest.pass_named(TIMING_PASS) is not None:
            kernels = [k for op in profile.operators for k in op.kernels] + profile.unattributed_kernels
            apply_unprofiled(profile, read_unprofiled(run_dir, kernels))
            apply_unprofiled_idle(profile)
    profile.warnings += [f"the {p.name} pass's workload left process {stray} running outside its process group "
                         "(a session of its own): it was stopped" for p in manifest.passes
                         for stray in p.stopped_processes]
    return profile


def write_profile(path: Path, profile: OperatorAttributedProfile) -> Path:
    """Atomically write a profile.json (operator by operator: a profile may hold millions)."""
    with gc_paused():
        write_model_streaming(path, profile, ("operators", "unattributed_kernels"))
    return path


__all__ = ["assemble_with", "write_profile"]
