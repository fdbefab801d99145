"""Assemble: rebuild profile.json from a run directory's raw artifacts alone (no GPU, no workload).

The readers' records are joined (nsys timeline with ncu counters), each kernel attributed to its operator and
module, and the operators aggregated: `assemble(run_dir)` is a pure function of the run directory's files.
"""

from __future__ import annotations

from pathlib import Path

from mcp_server.assemble.kineto import assemble_torch
from mcp_server.assemble.timeline import assemble_nsys
from mcp_server.assemble.unprofiled import apply_unprofiled, read_unprofiled
from mcp_server.errors import ProfileFormatError
from mcp_server.rundir import RunDir
from mcp_server.schema.io import write_model_streaming
from mcp_server.schema.profile import OperatorAttributedProfile
from plugins.bulk import gc_paused


def assemble(run_dir: RunDir) -> OperatorAttributedProfile:
    """Rebuild the profile of a run directory from its manifest and raw artifacts."""
    manifest = run_dir.read_manifest()
    with gc_paused():
        if manifest.pass_named("nsys") is not None:
            profile = assemble_nsys(run_dir, manifest)
        elif manifest.pass_named("torch") is not None:
            profile = assemble_torch(run_dir, manifest)
        else:
            raise ProfileFormatError(f"{run_dir.path} holds no capture pass", "re-run `operator-profiler profile`")
        if manifest.pass_named("timing") is not None:
            kernels = [k for op in profile.operators for k in op.kernels] + profile.unattributed_kernels
            apply_unprofiled(profile, read_unprofiled(run_dir, kernels))
    return profile


def write_profile(path: Path, profile: OperatorAttributedProfile) -> Path:
    """Atomically write a profile.json (operator by operator: a profile may hold millions)."""
    with gc_paused():
        write_model_streaming(path, profile, ("operators", "unattributed_kernels"))
    return path


__all__ = ["assemble", "write_profile"]
