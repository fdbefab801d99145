"""One rank's collectives: which operator calls communicate, their sequence numbers, and the modules whose
gradients each DDP bucket carries.

A collective is named by c10d's operator (`c10d::allreduce_`, the call), by the backend's record function
(`gloo:all_reduce`, `nccl:all_reduce`) or by its NCCL kernel (`ncclDevKernel_AllReduce_Sum_f32_RING_LL`). The
*transfer* is the call whose time is the communication: the one that owns the NCCL kernel on a GPU, the backend's
record function (run by its worker thread) on the CPU. Transfers are numbered per type in window order: every
rank issues the same collectives in the same order, so (type, number) names one call across ranks.

An FSDP2 collective carries one unit's parameters or gradients: it runs under the unit's range
(`FSDP::all_gather (layers.3)`), which the readers take as the module `layers.3`; the root unit's ranges name no
path, and its collectives, like any outside every module, are the model's own.

A DDP all-reduce carries one bucket: buckets are reduced in index order, and each transfer's element count is
checked against the bucket's, so a transfer whose size matches no bucket is left unmapped rather than guessed.
"""

from __future__ import annotations

import math
import re
from typing import Any

from mcp_server.schema.profile import DdpBucket, DistributedInfo, OperatorAttributedProfile, OperatorRecord

NCCL_KERNEL = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")
_CALL = re.compile(r"^c10d::_?([a-z_]+?)_?$")
_BACKEND = re.compile(r"^(?:gloo|nccl):_?([a-z_]+)$")
_NOISE = ("coalesced", "tensor", "base", "into")
# Collectives a backend runs as another: gloo reduces a reduce-scatter with an all-reduce of the whole input.
EMULATED_BY = {"allreduce": ("reducescatter",)}


def normal_name(raw: str) -> str:
    """`all_reduce`, `allreduce_`, `AllReduce`, `_reduce_scatter_base` -> allreduce / reducescatter."""
    name = raw.lower().replace("_", "")
    for word in _NOISE:
        name = name.replace(word, "")
    return name


def kernel_collective(kernel_name: str) -> str | None:
    """The collective an NCCL kernel runs, or None for any other kernel."""
    found = NCCL_KERNEL.search(kernel_name)
    return normal_name(found.group(1)) if found else None


def operator_collective(name: str) -> str | None:
    """The collective a c10d call or a backend record function names, or None."""
    found = _CALL.match(name) or _BACKEND.match(name)
    return normal_name(found.group(1)) if found else None


# torch.distributed's and FSDP's own operators, besides the collectives `operator_collective` names; the last two
# name DDP's reducer's (`torch::distributed::reducer::mul_out`, `torch.distributed.ddp.reducer::copy_bucket_to_grad`)
DISTRIBUTED_PREFIXES = ("fsdp::", "c10d::", "_c10d_functional::", "c10d_functional::", "nccl:", "gloo:",
                        "record_param_comms", "torch::distributed::", "torch.distributed.")


def distributed_operator(name: str) -> bool:
    """An operator of distributed training's own: a collective, or torch.distributed's and FSDP's operators."""
    return name.startswith(DISTRIBUTED_PREFIXES) or operator_collective(name) is not None


def annotate(profile: OperatorAttributedProfile, facts: dict[str, Any] | None) -> None:
    """Mark the profile's collectives (type, sequence number, bucket modules) and record the rank's facts in
    `capture_metadata.distributed` (`facts`: what the rank's harness recorded; None for one process).

    On a GPU the transfers (the calls owning NCCL kernels) are numbered in kernel order. On the CPU the c10d calls
    are numbered in host order, on the thread that issues them in program order, and each backend transfer (run
    by a worker thread, not always in call order) takes the number, bucket and phase of its call: the first
    unpaired call of its type whose size agrees."""
    if facts is None:
        return
    info = DistributedInfo.model_validate({k: v for k, v in facts.items() if k in DistributedInfo.model_fields})
    has_kernels = any(op.kernels for op in profile.operators) or bool(profile.unattributed_kernels)
    calls: list[OperatorRecord] = []
    transfers: list[OperatorRecord] = []
    for op in sorted(profile.operators, key=_order):
        from_kernels = sorted({c for k in op.kernels if (c := kernel_collective(k.kernel_name))})
        for kernel in op.kernels:
            if (c := kernel_collective(kernel.kernel_name)) is not None:
                info.collective_kernels[kernel.kernel_name] = c
        op.collective = from_kernels[0] if from_kernels else operator_collective(op.operator_name)
        if op.collective is None or "barrier" in op.collective:
            continue
        if from_kernels or (not has_kernels and op.operator_name.startswith(("gloo:", "nccl:"))):
            transfers.append(op)
        elif op.operator_name.startswith("c10d::"):
            calls.append(op)
    for kernel in profile.unattributed_kernels:
        if (c := kernel_collective(kernel.kernel_name)) is not None:
            info.collective_kernels[kernel.kernel_name] = c
    root = profile.capture_metadata.root_module
    numbered = transfers if has_kernels else calls
    _number(numbered)
    sizes = _map_buckets([op for op in numbered if op.collective == "allreduce"], info.ddp_buckets, root)
    if not has_kernels:
        _pair(transfers, calls, sizes)
    for op in (*calls, *transfers):  # outside every module and unit (FSDP's root unit): the model's own
        if op.module_path is None:
            op.module_path = root
            for kernel in op.kernels:
                kernel.module_path = kernel.module_path or root
    profile.capture_metadata.distributed = info


def _number(ops: list[OperatorRecord]) -> None:
    counts: dict[str, int] = {}
    for op in ops:
        assert op.collective is not None
        op.collective_seq = counts[op.collective] = counts.get(op.collective, -1) + 1


def _pair(transfers: list[OperatorRecord], calls: list[OperatorRecord], sizes: dict[int, int]) -> None:
    """Each transfer the type, number, bucket modules, module, phase and line of its call: the first open call of its
    type whose size agrees, else the first of a type the backend runs as this one whose inputs hold its size
    (gloo's all-reduce under a reduce-scatter), else the first open call of its type."""
    open_calls = list(calls)
    for transfer in transfers:
        same = [c for c in open_calls if c.collective == transfer.collective]
        numel = _numel(transfer)
        emulated = [c for c in open_calls if c.collective in EMULATED_BY.get(transfer.collective or "", ())
                    and numel is not None and numel in _numels(c)]
        call = next((c for c in same if sizes.get(id(c), _numel(c)) == numel),
                    emulated[0] if emulated else same[0] if same else None)
        if call is None:
            continue
        open_calls.remove(call)
        transfer.collective, transfer.collective_seq = call.collective, call.collective_seq
        transfer.collective_modules = call.collective_modules
        transfer.module_path, transfer.phase = call.module_path or transfer.module_path, call.phase
        transfer.call_site = transfer.call_site or call.call_site


def _order(op: OperatorRecord) -> int:
    """Window order: the first kernel's launch ordinal on a GPU, the host start in a CPU-only profile."""
    if op.kernels:
        return min(k.kernel_id for k in op.kernels)
    return op.host_start_ns if op.host_start_ns is not None else 1 << 62


def _numel(op: OperatorRecord) -> int | None:
    shapes = op.input_shapes or []
    first = shapes[0] if shapes else None
    if not first or not all(isinstance(d, int) for d in first):
        return None
    return math.prod(first)


def _numels(op: OperatorRecord) -> set[int]:
    return {math.prod(dims) for dims in op.input_shapes or [] if dims and all(isinstance(d, int) for d in dims)}


def _map_buckets(allreduces: list[OperatorRecord], buckets: list[DdpBucket], root: str | None) -> dict[int, int]:
    """Each all-reduce its bucket: the next in index order when its size agrees (or is unknown), else the one
    bucket of its size; the modules' shares of the bucket's elements; the call's module their common path.
    Returns each mapped call's bucket size (by `id`)."""
    sizes: dict[int, int] = {}
    if not buckets:
        return sizes
    position = 0
    for op in allreduces:
        numel = _numel(op)
        expected = buckets[position % len(buckets)]
        if numel is None or numel == expected.numel:
            bucket: DdpBucket | None = expected
        else:
            same = [b for b in buckets if b.numel == numel]
            bucket = same[0] if len(same) == 1 else None
        if bucket is None:
            continue
        position = bucket.index + 1
        sizes[id(op)] = bucket.numel
        total = sum(bucket.module_numel.values()) or 1
        op.collective_modules = {m: round(n / total, 6) for m, n in bucket.module_numel.items()}
        path = common_path(bucket.modules) or root
        op.module_path = path
        for kernel in op.kernels:
            kernel.module_path = path
    return sizes


def common_path(paths: list[str]) -> str | None:
    """The longest dotted prefix every path shares (`layers.2.fc`, `layers.3` -> `layers`), or None."""
    if not paths:
        return None
    parts = [p.split(".") for p in paths]
    shared = []
    for column in zip(*parts, strict=False):
        if len(set(column)) != 1:
            break
        shared.append(column[0])
    return ".".join(shared) or None
