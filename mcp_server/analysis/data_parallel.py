"""A window run by `nn.DataParallel`: one process drives every GPU, replicating the model onto each at every call
(its weights broadcast by NCCL), running the copies on threads of its own, and reducing the gradients back onto the
first GPU. PyTorch recommends DistributedDataParallel in its place: a process per GPU, the weights replicated once,
the gradients all-reduced while the backward runs. The finding gives the profile's evidence (the broadcasts' and
reductions' kernel time, how much of their busy time the GPUs spent at once), and advice to capture or compile the
whole window asks for that replacement first: a CUDA graph cannot capture a call that replicates the model and runs
the copies on threads."""

from __future__ import annotations

from mcp_server.analysis.syncs import SHORT_END
from mcp_server.assemble.collectives import kernel_collective
from mcp_server.schema.analysis import Finding, TimelineHealth
from mcp_server.schema.profile import OperatorAttributedProfile

WRAPPER = "DataParallel"  # the root module's name, as the harness names a model by its class
NEED = (f"replace nn.DataParallel by DistributedDataParallel{SHORT_END}it replicates the model onto every GPU and runs "
        "the copies on threads at each call, which a CUDA graph cannot capture; one process per GPU under torchrun "
        "(`operator-profiler run --nproc-per-node N` profiles it)")


def runs_data_parallel(profile: OperatorAttributedProfile) -> bool:
    """The window's model is `nn.DataParallel` and its kernels ran on several GPUs (on one, it calls the model)."""
    devices = {k.device_id for op in profile.operators for k in op.kernels if k.device_id is not None}
    return profile.capture_metadata.root_module == WRAPPER and len(devices) > 1


def data_parallel_finding(profile: OperatorAttributedProfile, health: TimelineHealth) -> Finding | None:
    """The replication's cost as the profile measured it, where `runs_data_parallel`; None otherwise."""
    if not runs_data_parallel(profile):
        return None
    kernels = [k for op in profile.operators for k in op.kernels]
    total = sum(k.duration_ns for k in kernels) or 1
    collectives = sum(k.duration_ns for k in kernels if kernel_collective(k.kernel_name))
    busiest = max((d.busy_ns for d in health.devices), default=0)
    together = (f"; the GPUs were busy at once for {health.device_overlap_ns / 1e3:.1f} us of the busiest one's "
                f"{busiest / 1e3:.1f} us" if busiest else "")
    return Finding(
        kind="data_parallel", title=f"nn.DataParallel replicates the model onto {len(health.devices)} GPUs at every "
        "call, from one process",
        operators=[], module_paths=[WRAPPER], kernel_ids=[],
        triggers=[f"gpus={len(health.devices)}", f"collective_kernel_ns={collectives}",
                  f"collective_kernel_pct={100 * collectives / total:.1f}",
                  f"device_overlap_ns={health.device_overlap_ns}", f"busiest_device_ns={busiest}"],
        detail=f"Its weight broadcasts and gradient reductions (NCCL) take {collectives / 1e3:.1f} us, "
               f"{100 * collectives / total:.1f} % of the kernel time{together}. Every call copies the weights "
               "again and runs the replicas on threads of one process; DistributedDataParallel runs a process per GPU "
               "and overlaps its all-reduce with the backward.")
