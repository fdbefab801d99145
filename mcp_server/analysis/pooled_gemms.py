"""GEMM outputs that are only max-pooled: a forward matmul or convolution whose kernels are followed, through
normalisation and activation kernels only (patterns.yaml `pool_epilogue_ops`), by a max reduction (`max_pool_ops`,
or a generated kernel that absorbed one). PointNet's shared per-point MLP ends so: its widest activation (batch x
1,024 channels x points) is written by the GEMM and read back whole by the reduction, which keeps one value per
channel. A GEMM with the affine, the activation and the max in its epilogue writes only the pooled values
(knowledge/fx_patterns/max_epilogue.py); Inductor cannot fuse a reduction into a GEMM.
"""

from __future__ import annotations

from mcp_server.analysis.detect import gemm_kind
from mcp_server.analysis.rules import matches
from mcp_server.analysis.timeline_health import Placed, kernels_finding
from mcp_server.schema.analysis import Finding
from mcp_server.schema.profile import OperatorAttributedProfile, OperatorRecord


def _names(op: OperatorRecord | None) -> list[str]:
    """The op's own name and, for a generated kernel, the ops it absorbed."""
    return [] if op is None else [op.operator_name, *op.fused_operators]


def _pools(p: Placed) -> bool:
    """A max reduction, or a generated kernel that absorbed one and no softmax (whose max is its own)."""
    names = _names(p.op)
    return any(matches("max_pool_ops", n) for n in names) and not any(matches("softmax_ops", n) for n in names)


def _between(p: Placed) -> bool:
    return p.op is not None and not p.op.is_fused and matches("pool_epilogue_ops", p.op.operator_name)


def _gemm(p: Placed) -> bool:
    return p.op is not None and p.op.phase != "backward" and gemm_kind(p.op, p.kernel) is not None


def pooled_chains(placed: list[Placed]) -> list[list[Placed]]:
    """Each GEMM's kernels (those of its operator call just before the chain), the kernels between, and the max
    reduction, in timeline order."""
    chains: list[list[Placed]] = []
    for i, p in enumerate(placed):
        if not _pools(p) or p.op is None or p.op.phase == "backward":
            continue
        j = i - 1
        while j >= 0 and _between(placed[j]):
            j -= 1
        if j < 0 or not _gemm(placed[j]):
            continue
        gemm = placed[j].op
        start = j
        while start > 0 and placed[start - 1].op is gemm:
            start -= 1
        chains.append(placed[start:i + 1])
    return chains


def kept_kernel(chain: list[Placed]) -> int:
    """The kernel a fused chain keeps: the GEMM operator's longest kernel (the multiply itself)."""
    gemm = chain[0].op
    return max((p for p in chain if p.op is gemm), key=lambda p: p.kernel.duration_ns).kernel.kernel_id


def pooled_gemm_output(profile: OperatorAttributedProfile, placed: list[Placed]) -> Finding | None:
    """The window's GEMM outputs that only a max reduction reads, as one finding (None without them)."""
    chains = pooled_chains(placed)
    if not chains:
        return None
    members = [p for chain in chains for p in chain]
    pooled_ns = sum(p.kernel.duration_ns for chain in chains for p in chain if p.kernel.kernel_id != kept_kernel(chain))
    return kernels_finding(
        "pooled_gemm_output", f"{len(chains)} GEMM/convolution output(s) written in full only to be max-pooled",
        members, [f"pooled_chains={len(chains)}", f"chain_kernels={len(members)}",
                  f"pooling_kernel_time_ns={pooled_ns}", f"compile_mode={profile.capture_metadata.compile_mode}"],
        "Each GEMM writes its whole output and the next kernels read it back only to keep its maximum over the points "
        "(after a normalisation and an activation). Neither eager PyTorch nor Inductor fuses a reduction into a GEMM; "
        "one Triton kernel can apply the affine, the activation and the max in the GEMM's epilogue and write only the "
        "pooled values.",
    )
