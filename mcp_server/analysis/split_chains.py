"""Chains a compiler split: in a compiled window, an op Inductor calls as it is (top-k, sort, cumsum on some
devices: patterns.yaml `split_ops`) with a generated kernel right before it and right after it. Inductor fuses
everything around the op but not across it, so the chain runs as several kernels, each reading what the previous
one wrote; one hand-written Triton kernel registered with torch.library does it in one pass
(knowledge/fx_patterns/triton_op.py).
"""

from __future__ import annotations

from mcp_server.analysis.rules import matches
from mcp_server.analysis.timeline_health import Placed, kernels_finding
from mcp_server.schema.analysis import Finding
from mcp_server.schema.profile import OperatorAttributedProfile


def _generated(p: Placed) -> bool:
    """A kernel Inductor generated (its operator is a fused one)."""
    return p.op is not None and p.op.is_fused


def _split_op(p: Placed) -> str | None:
    """The name of the op Inductor called as it is that launched this kernel, when it is one of `split_ops`."""
    for name in (p.op.operator_name if p.op is not None else None, p.kernel.attribution.launch_op):
        if matches("split_ops", name):
            return name
    return None


def split_chains(placed: list[Placed]) -> list[list[Placed]]:
    """Each run of a split op's kernels with the generated kernel just before it and the one just after it, in
    timeline order."""
    chains: list[list[Placed]] = []
    i = 1
    while i < len(placed):
        op = _split_op(placed[i])
        if op is None or not _generated(placed[i - 1]):
            i += 1
            continue
        end = i
        while end + 1 < len(placed) and _split_op(placed[end + 1]) == op:
            end += 1
        if end + 1 < len(placed) and _generated(placed[end + 1]):
            chains.append(placed[i - 1:end + 2])
        i = end + 1
    return chains


def split_fusion(profile: OperatorAttributedProfile, placed: list[Placed]) -> Finding | None:
    """The window's split chains as one finding (None in eager mode, or without them)."""
    if profile.capture_metadata.compile_mode == "eager":
        return None
    chains = split_chains(placed)
    if not chains:
        return None
    ops = list(dict.fromkeys(op for chain in chains for p in chain if (op := _split_op(p))))
    members = [p for chain in chains for p in chain]
    time_ns = sum(p.kernel.duration_ns for p in members)
    return kernels_finding(
        "split_fusion", f"{len(chains)} chain(s) of {len(members)} kernels that Inductor split around {', '.join(ops)}",
        members, [f"split_chains={len(chains)}", f"chain_kernels={len(members)}", f"chain_kernel_time_ns={time_ns}",
                  *(f"split_op={op}" for op in ops)],
        "Inductor calls these ops as they are: the generated kernels before and after each cannot fuse across "
        "it, so the chain writes and re-reads its intermediates in several kernels. One Triton kernel "
        "registered with torch.library (a fake implementation for the compiler) runs the chain in one pass.",
    )
