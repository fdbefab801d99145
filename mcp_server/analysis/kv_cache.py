"""A decode loop's KV cache that grows: an attention site (operator and module path) called with one query position
and a key length one more than at its previous call, step after step. Every step then has new shapes, so nothing
static can be captured until the cache is preallocated at its final length (knowledge/fx_patterns/static_kv_cache.py).
"""

from __future__ import annotations

from collections import defaultdict

from mcp_server.analysis.rules import matches, rule
from mcp_server.analysis.syncs import SHORT_END
from mcp_server.schema.analysis import Finding
from mcp_server.schema.profile import OperatorAttributedProfile, OperatorRecord

KV_NEED = (f"preallocate the KV cache at its final length{SHORT_END}each decode step's attention reads a longer cache, "
           "so every step has new shapes (knowledge/fx_patterns/static_kv_cache.py)")


def _lengths(op: OperatorRecord) -> tuple[int, int] | None:
    """(query positions, key length) of an attention call from its input shapes, None when they do not say."""
    shapes = [s for s in op.input_shapes or [] if s]
    if len(shapes) < 2 or len(shapes[0]) < 3 or len(shapes[1]) < 3:
        return None
    query, keys = shapes[0], shapes[1]
    if matches("sdpa_ops", op.operator_name):
        return query[-2], keys[-2]
    if matches("score_matmul_ops", op.operator_name) and keys[-2] == query[-1]:  # q @ k^T
        return query[-2], keys[-1]
    return None


def _steps(calls: list[tuple[int, int]]) -> int:
    """Calls with one query position whose key length is the previous call's plus one."""
    return sum(1 for (_, before), (queries, now) in zip(calls, calls[1:], strict=False)
               if queries == 1 and now == before + 1)


def _site(op: OperatorRecord) -> tuple[str, str, int | None, str | None]:
    """Where an attention call's key lengths are followed: its operator, module path and call site (a decoder layer's
    self-attention over its growing cache and its cross-attention over the fixed source are one module's calls of
    one operator, at two lines), and for a score matmul the dimension it contracts (the head size). A hand-written
    attention's probabilities @ values is a matmul of the same module too, read as (1 query, the head size); its
    contracted dimension is the key length, new every step, so it never joins the score matmul's calls."""
    shapes = op.input_shapes or []
    contracted = shapes[0][-1] if matches("score_matmul_ops", op.operator_name) and shapes and shapes[0] else None
    return op.operator_name, op.module_path or "", contracted, op.call_site


def growing_kv_cache(profile: OperatorAttributedProfile) -> Finding | None:
    """The attention sites whose key length grows by one per decode step, as one finding (None without them)."""
    sites: dict[tuple[str, str, int | None, str | None], list[tuple[OperatorRecord, tuple[int, int]]]] = (
        defaultdict(list))
    for op in profile.operators:
        if op.module_path and (lengths := _lengths(op)) is not None:
            sites[_site(op)].append((op, lengths))
    least = int(rule("decode", "min_growing_steps"))
    growing = {site: calls for site, calls in sites.items() if _steps([c for _, c in calls]) >= least}
    if not growing:
        return None
    ops = [op for calls in growing.values() for op, _ in calls]
    keys = [c[1] for calls in growing.values() for _, c in calls if c[0] == 1]
    steps = max(_steps([c for _, c in calls]) for calls in growing.values())
    modules = list(dict.fromkeys(module for _, module, _, _ in growing))
    return Finding(
        kind="growing_kv_cache",
        title=f"the KV cache grows by one position per decode step at {len(modules)} attention module(s), key "
              f"lengths {min(keys)}-{max(keys)}",
        operators=[op.operator_id for op in ops], module_paths=modules,
        kernel_ids=[k.kernel_id for op in ops for k in op.kernels],
        triggers=[f"growing_attention_sites={len(growing)}", f"decode_steps={steps}",
                  f"key_length_min={min(keys)}", f"key_length_max={max(keys)}"],
        detail="Every decode step's attention reads one key more, so every step has new shapes: a CUDA graph "
               "cannot replay it, torch.compile recompiles or goes dynamic. Preallocate the cache at its final length "
               "and mask the positions not written yet; then each step has one shape to capture.",
    )
