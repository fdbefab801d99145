"""Findings: what lowers the peak, each with the evidence that triggered it, an upper-bound estimate of the bytes it
removes from the peak (labelled an estimate) and the change to make.

Every rule reads only the blocks live at the peak (or at a failed allocation) and the allocator's peaks.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from mcp_server.memory.attribute import Attributed
from mcp_server.memory.units import size
from mcp_server.schema.memory import MemoryFinding, MemoryPattern

ELEMENTWISE = re.compile(r"aten::(relu|gelu|silu|sigmoid|tanh|add|mul|sub|div|dropout|native_dropout|clone|"
                         r"masked_fill|hardtanh|leaky_relu|elu|where|exp|neg|pow)\b")
ACTIVATION_SHARE = 0.2  # activations above this share of the peak: checkpointing and bf16 are worth it
OPTIMIZER_SHARE = 0.2
IN_PLACE_SHARE = 0.05
RETAINED_MIN = 64 * 1024 ** 2
FRAGMENTATION_SHARE = 0.2
FRAGMENTATION_MIN = 512 * 1024 ** 2
STATE_8BIT_SAVING = 0.75  # 8-bit optimizer state instead of fp32: a quarter of the bytes


def block_of(module: str | None) -> str | None:
    """The repeated block a module belongs to: the path up to its first numbered component (`layers.3` of
    `layers.3.attn.q`), else its first component."""
    if module is None:
        return None
    parts = module.split(".")
    numbered = next((i for i, part in enumerate(parts) if part.isdigit()), None)
    return ".".join(parts[: numbered + 1]) if numbered is not None else parts[0]


@dataclass
class Peak:
    """What the rules read: the live blocks, their total, and the allocator's peaks."""

    live: list[Attributed]
    total: int
    allocated_peak: int | None
    reserved_peak: int | None

    def of(self, *categories: str) -> list[Attributed]:
        return [e for e in self.live if e.category in categories]

    def finding(self, pattern: MemoryPattern, title: str, saving: int, estimate: str, evidence: list[str],
                modules: list[str], change: str) -> MemoryFinding:
        return MemoryFinding(pattern=pattern, title=title, saving_bytes=int(saving),
                             saving_pct=round(100.0 * saving / self.total, 1) if self.total else 0.0,
                             estimate=f"upper bound (estimate): {estimate}", evidence=evidence, modules=modules,
                             change=change)


def _bytes(blocks: list[Attributed]) -> int:
    return sum(e.block.bytes for e in blocks)


def _checkpointing(peak: Peak) -> MemoryFinding | None:
    saved = peak.of("activation")
    by_block: dict[str, int] = {}
    for entry in saved:
        key = block_of(entry.module)
        if key is not None:
            by_block[key] = by_block.get(key, 0) + entry.block.bytes
    if _bytes(saved) < ACTIVATION_SHARE * peak.total or len(by_block) < 2:
        return None
    ranked = sorted(by_block.items(), key=lambda kv: -kv[1])
    saving = sum(by_block.values()) - ranked[0][1]
    return peak.finding(
        "activation_checkpointing", f"checkpoint the activations of {len(by_block)} modules",
        saving, "the activations these modules hold at the peak, less the largest module's (recomputed during "
        "backward); each module's input stays saved",
        [f"activations at the peak: {size(_bytes(saved))} of {size(peak.total)}"]
        + [f"{name}: {size(b)}" for name, b in ranked[:5]], [name for name, _ in ranked],
        "wrap each of these modules' forward: `x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)` "
        "(or `torch.distributed.algorithms._checkpoint.checkpoint_wrapper.checkpoint_wrapper(block)`); recompute "
        "costs about one extra forward of those modules")


def _set_to_none(peak: Peak) -> MemoryFinding | None:
    held = [e for e in peak.of("gradient") if e.block.alloc_us is None]
    if not held:
        return None
    return peak.finding(
        "zero_grad_set_to_none", "free the gradients between steps", _bytes(held),
        "the gradients held from the previous step at the peak",
        [f"{len(held)} gradients ({size(_bytes(held))}) were allocated before the window and are live at the peak"],
        sorted({m for e in held if (m := block_of(e.module))})[:10],
        "`optimizer.zero_grad(set_to_none=True)` (the default since torch 2.0; not `zero_grad(set_to_none=False)` "
        "or `p.grad.zero_()`), so the gradients are allocated during backward and not held through the forward")


def _bf16(peak: Peak) -> MemoryFinding | None:
    fp32 = [e for e in peak.of("activation") if e.dtype == "float32"]
    if _bytes(fp32) < ACTIVATION_SHARE * peak.total:
        return None
    return peak.finding(
        "bf16_activations", "keep activations in bfloat16", _bytes(fp32) // 2,
        "half of the float32 activations live at the peak",
        [f"float32 activations at the peak: {size(_bytes(fp32))} in {len(fp32)} blocks"],
        sorted({m for e in fp32 if (m := block_of(e.module))})[:10],
        "run the forward under `with torch.autocast('cuda', dtype=torch.bfloat16):` (matmuls and convolutions then "
        "save bf16 activations), or cast the model with `model.to(torch.bfloat16)` where the precision allows")


def _in_place(peak: Peak) -> MemoryFinding | None:
    made = [e for e in peak.of("activation", "temporary") if e.operator and ELEMENTWISE.match(e.operator)]
    if _bytes(made) < IN_PLACE_SHARE * peak.total:
        return None
    ops: dict[str, int] = {}
    for e in made:
        name = str(e.operator).split(" ")[0]
        ops[name] = ops.get(name, 0) + e.block.bytes
    return peak.finding(
        "in_place_ops", "use in-place elementwise operators", _bytes(made),
        "the outputs of elementwise operators live at the peak; autograd refuses in-place where the input is saved "
        "for backward",
        [f"{name}: {size(b)}" for name, b in sorted(ops.items(), key=lambda kv: -kv[1])[:5]],
        sorted({m for e in made if (m := block_of(e.module))})[:10],
        "use the in-place forms where the input is not needed afterwards: `nn.ReLU(inplace=True)`, "
        "`F.relu(x, inplace=True)`, `x.add_(y)`, `x.mul_(s)`")


def _retained(peak: Peak) -> MemoryFinding | None:
    held = peak.of("retained")
    if _bytes(held) < max(RETAINED_MIN, 0.01 * peak.total):
        return None
    sites: dict[str, int] = {}
    for e in held:
        sites[e.call_site or "unknown line"] = sites.get(e.call_site or "unknown line", 0) + e.block.bytes
    return peak.finding(
        "references_across_steps", "free what is held from one step to the next", _bytes(held),
        "the live blocks allocated outside the window, or kept after it, that no parameter, buffer, gradient, "
        "optimizer state, input or output accounts for",
        [f"{site}: {size(b)}" for site, b in sorted(sites.items(), key=lambda kv: -kv[1])[:5]], [],
        "drop references that outlive a step: log `loss.item()` or `loss.detach()` instead of `loss`, `del` outputs "
        "and intermediate results you keep in lists or attributes, and do not keep graphs alive across steps")


def _fragmentation(peak: Peak) -> MemoryFinding | None:
    if peak.reserved_peak is None or peak.allocated_peak is None:
        return None
    gap = peak.reserved_peak - peak.allocated_peak
    if gap < max(FRAGMENTATION_MIN, FRAGMENTATION_SHARE * peak.reserved_peak):
        return None
    return peak.finding(
        "expandable_segments", "reserved memory far above allocated: fragmentation", gap,
        "peak reserved minus peak allocated: cached segments no request could use",
        [f"peak reserved {size(peak.reserved_peak)}, peak allocated {size(peak.allocated_peak)}"], [],
        "set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` before the process starts (segments then grow in "
        "place instead of leaving unusable slivers)")


def _optimizer_state(peak: Peak) -> MemoryFinding | None:
    state = peak.of("optimizer_state")
    multi = [e for e in peak.of("temporary") if e.operator and e.operator.startswith("aten::_foreach")]
    if _bytes(state) < OPTIMIZER_SHARE * peak.total and not multi:
        return None
    saving = int(STATE_8BIT_SAVING * _bytes(state)) + _bytes(multi)
    evidence = [f"optimizer state at the peak: {size(_bytes(state))}"]
    if multi:
        evidence.append(f"multi-tensor (foreach) temporaries at the peak: {size(_bytes(multi))}")
    return peak.finding(
        "optimizer_state", "shrink the optimizer's state and its step's temporaries", saving,
        "three quarters of the fp32 optimizer state (8-bit state) plus the foreach step's temporaries at the peak",
        evidence, [],
        "`torch.optim.AdamW(params, fused=True)` runs the step without multi-tensor temporaries; 8-bit state "
        "(`bitsandbytes.optim.AdamW8bit`) keeps a quarter of the bytes; Adafactor factors the second moment; "
        "SGD with momentum keeps one buffer instead of two")


RULES: tuple[Callable[[Peak], MemoryFinding | None], ...] = (
    _checkpointing, _set_to_none, _bf16, _in_place, _retained, _fragmentation, _optimizer_state)


def findings(peak: Peak) -> list[MemoryFinding]:
    """Every rule that fires on the peak, largest saving first."""
    found = [f for rule in RULES if (f := rule(peak)) is not None]
    return sorted(found, key=lambda f: -f.saving_bytes)
