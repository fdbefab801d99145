"""Pattern detectors: FP32 GEMMs/convs on CUDA cores, unfused attention, tiny-kernel swarms, a host-bound
window, unfolded batch norms, layout conversions, host syncs, separate q/k/v projections, register spills.

Each returns `Finding`s with the operators, modules and kernels involved and `metric=value` triggers; names
come from patterns.yaml and thresholds from knowledge/bottleneck_rules.yaml.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from mcp_server.analysis.rules import matches, patterns, rule
from mcp_server.analysis.syncs import counted_repeats
from mcp_server.analysis.timeline_health import Placed
from mcp_server.schema.analysis import Finding, TimelineHealth
from mcp_server.schema.profile import KernelRecord, OperatorAttributedProfile, OperatorRecord, split_module_path

_LOW_PRECISION = re.compile(r"bfloat16|half|float16|float8|double|int", re.IGNORECASE)


def _v(kernel: KernelRecord, key: str) -> float | None:
    metric = kernel.metrics.get(key)
    return metric.value if metric is not None else None


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def _uniq(values: list[str | None]) -> list[str]:
    return list(dict.fromkeys(v for v in values if v))


def gemm_kind(op: OperatorRecord | None, kernel: KernelRecord) -> str | None:
    """'matmul' or 'conv' when the kernel belongs to a GEMM/conv operator (or was launched by one)."""
    names = [op.operator_name if op and not op.is_fused else None, kernel.attribution.launch_op]
    if any(matches("conv_ops", n) for n in names):
        return "conv"
    if any(matches("matmul_ops", n) for n in names):
        return "matmul"
    return None


def _fp32_on_cuda_cores(kernel: KernelRecord) -> bool:
    """True when the kernel does FP32 math on CUDA cores: by its counters when it has them, else by its name."""
    named = matches("fp32_cuda_core_kernels", kernel.kernel_name) and not matches("tensor_core_kernels",
                                                                                  kernel.kernel_name)
    if not kernel.metrics:
        return named
    tensor_flop = sum(_v(kernel, k) or 0.0 for k in kernel.metrics if k.startswith("flop_tensor_"))
    ffma = _v(kernel, "inst_ffma") or 0.0
    tensor_pipe = _v(kernel, "tensor_pipe_active_pct")
    low = tensor_pipe is not None and tensor_pipe < rule("tensor", "low_tensor_pipe_pct")
    return tensor_flop == 0 and ffma > 0 and (low or named)


def _depthwise_of_unknown_precision(p: Placed) -> bool:
    """A depthwise convolution (one input channel per group: by its kernel's name or its weight's shape) whose
    kernel name does not say it computes in float. A half-precision one accumulates in FP32 (FFMA, no tensor
    pipe) and, replayed from a graph or compiled, records no dtype: its counters alone read as FP32 math."""
    shapes = (p.op.input_shapes if p.op else None) or []
    x, w = (shapes[0], shapes[1]) if len(shapes) >= 2 else (None, None)
    by_shape = bool(x and w and len(x) == len(w) >= 3 and w[1] == 1 and x[1] > 1)
    if not (by_shape or matches("depthwise_conv_kernels", p.kernel.kernel_name)):
        return False
    return not matches("float_template_kernels", p.kernel.kernel_name)


def _fp32_triggers(members: list[Placed]) -> list[str]:
    kernels = [p.kernel for p in members]
    if not any(k.metrics for k in kernels):
        return [f"kernel={_short(kernels[0].kernel_name, 48)}"]
    pipe = max((_v(k, "tensor_pipe_active_pct") or 0.0) for k in kernels)
    ffma = sum((_v(k, "inst_ffma") or 0.0) for k in kernels)
    return [f"tensor_pipe_active_pct_max={pipe:.1f}", f"inst_ffma={ffma:.0f}", "flop_tensor=0"]


def fp32_tensor_core_candidates(profile: OperatorAttributedProfile, placed: list[Placed]) -> list[Finding]:
    """GEMMs and convolutions running FP32 on CUDA cores, where TF32/BF16 tensor cores would serve."""
    groups: dict[str, list[Placed]] = {"matmul": [], "conv": []}
    for p in placed:
        kind = gemm_kind(p.op, p.kernel)
        if kind is None or (p.op and any(_LOW_PRECISION.search(d or "") for d in (p.op.input_dtypes or [])[:2])):
            continue
        if _fp32_on_cuda_cores(p.kernel) and not (kind == "conv" and _depthwise_of_unknown_precision(p)):
            groups[kind].append(p)
    findings = []
    for kind, members in groups.items():
        if not members:
            continue
        time_ns = sum(p.kernel.duration_ns for p in members)
        nchw = kind == "conv" and any(matches("nchw_conv_kernels", p.kernel.kernel_name) for p in members)
        formats = _format_trigger([p.op for p in members]) if kind == "conv" else []
        if kind == "matmul":
            detail = ("FP32 GEMMs run on CUDA cores (torch.backends.cuda.matmul.allow_tf32 is False by default): "
                      "TF32 tensor cores, or BF16 autocast that halves the bytes too, are a reduced-precision "
                      "change scoped to the model (not the process-wide set_float32_matmul_precision).")
        else:
            detail = ("FP32 convolutions run on CUDA cores" + (" in NCHW layout" if nchw else "") + ": cuDNN picks "
                      f"TF32 tensor-core kernels for {memory_format(formats)} "
                      "inputs (allow_tf32 is on for cuDNN by default); BF16 autocast goes further.")
        findings.append(Finding(
            kind=f"fp32_{kind}", title=f"{len(members)} FP32 {kind} kernels on CUDA cores",
            operators=_uniq([p.op.operator_id if p.op else None for p in members]),
            module_paths=_uniq([p.kernel.module_path or (p.op.module_path if p.op else None) for p in members]),
            kernel_ids=[p.kernel.kernel_id for p in members],
            triggers=[*_fp32_triggers(members), f"kernel_time_ns={time_ns}", f"kernels={len(members)}"]
            + (["layout=NCHW"] if nchw else []) + formats,
            detail=detail,
        ))
    return findings


_HALF = re.compile(r"bfloat16|half|float16", re.IGNORECASE)


def _half_gemm(p: Placed) -> bool:
    """A GEMM computing in bfloat16/float16: by its counters' tensor FLOPs when it has them, else by its name or its
    operator's input dtypes."""
    if gemm_kind(p.op, p.kernel) != "matmul":
        return False
    if p.kernel.metrics:
        flops = {k: _v(p.kernel, k) or 0.0 for k in ("flop_tensor_bf16", "flop_tensor_fp16", "flop_tensor_fp8")}
        return flops["flop_tensor_fp8"] == 0.0 and flops["flop_tensor_bf16"] + flops["flop_tensor_fp16"] > 0
    return matches("half_gemm_kernels", p.kernel.kernel_name) or (
        p.op is not None and any(_HALF.search(d or "") for d in (p.op.input_dtypes or [])[:2]))


def half_precision_gemms(profile: OperatorAttributedProfile, placed: list[Placed]) -> list[Finding]:
    """BF16/FP16 GEMMs holding a large share of the kernel time (bottleneck_rules.yaml tensor.half_matmul_min_pct):
    FP8 GEMMs, in the fp8 precision tier, would double their tensor-core peak."""
    members = [p for p in placed if _half_gemm(p)]
    total = sum(p.kernel.duration_ns for p in placed)
    time_ns = sum(p.kernel.duration_ns for p in members)
    if not members or not total or 100.0 * time_ns / total < rule("tensor", "half_matmul_min_pct"):
        return []
    return [Finding(
        kind="half_matmul", title=f"{len(members)} BF16/FP16 GEMM kernels hold {100.0 * time_ns / total:.0f} % of "
        "the kernel time",
        operators=_uniq([p.op.operator_id if p.op else None for p in members]),
        module_paths=_uniq([p.kernel.module_path or (p.op.module_path if p.op else None) for p in members]),
        kernel_ids=[p.kernel.kernel_id for p in members],
        triggers=[f"kernel_time_ns={time_ns}", f"kernel_time_pct={100.0 * time_ns / total:.1f}",
                  f"kernels={len(members)}"],
        detail="The GEMMs already run on BF16/FP16 tensor cores; FP8 GEMMs (torch._scaled_mm with per-tensor "
               "scales) double the tensor-core peak on GPUs of compute capability 8.9 or more, at the fp8 tier's "
               "error.",
    )]


def _layer_key(module: str) -> str:
    return re.sub(r"\.\d+(?=\.|$)", ".#", module)


def _has_softmax(op: OperatorRecord) -> bool:
    return (matches("softmax_ops", op.operator_name) or any(matches("softmax_ops", f) for f in op.fused_operators)
            or any(matches("softmax_kernels", k.kernel_name) for k in op.kernels))


def _scores_then_values(ops: list[OperatorRecord]) -> bool | None:
    """Whether the module's batched matmuls hold attention's pair, by their input shapes: q [..., L, D] @ k^T
    [..., D, S], then the weights [..., L, S] @ v [..., S, E], with S == L (self-attention) or L == 1 (a decode step).
    None when no matmul has its shapes (fused or unrecorded): the shapes cannot tell then. A two-layer MLP run as
    batched matmuls (experts: tokens x width @ width x hidden, then @ hidden x width) has the first form, not S == L."""
    shaped = [[list(s or []) for s in (o.input_shapes or [])[first:first + 2]] for o in ops
              if matches("attention_matmul_ops", o.operator_name)
              for first in [1 if o.operator_name == "aten::baddbmm" else 0]]  # baddbmm(bias, a, b)
    shaped = [s for s in shaped if len(s) == 2 and min(len(s[0]), len(s[1])) >= 3]
    if not shaped:
        return None
    for i, (q, k) in enumerate(shaped):
        if q[-1] != k[-2] or q[:-2] != k[:-2]:
            continue
        length, keys = q[-2], k[-1]
        if (keys == length or length == 1) and any(w == [*q[:-1], keys] for w, _ in shaped[i + 1:]):
            return True
    return False


def _one_d_conv(op: OperatorRecord | None) -> bool:
    """A 1-D convolution (its input 3-d): channels_last lays out 4-d tensors only, so cuDNN's layout conversions
    around it stay whatever the model's memory format."""
    if op is None or not op.input_shapes or not matches("conv_ops", op.operator_name):
        return False
    first = op.input_shapes[0]
    return first is not None and len(first) == 3


def unfused_attention(profile: OperatorAttributedProfile) -> list[Finding]:
    """Attention computed as matmul + softmax + matmul in one module (`_scores_then_values` when the matmuls' shapes
    are known), or SDPA running its math path."""
    by_module: dict[str, list[OperatorRecord]] = {}
    for op in profile.operators:  # an Inductor kernel fused across modules counts in each (its softmax with a bias)
        for path in split_module_path(op.module_path):
            by_module.setdefault(path, []).append(op)

    def fused(ops: list[OperatorRecord]) -> bool:
        return any(matches("fused_attention_kernels", k.kernel_name) for o in ops for k in o.kernels)

    def has_mm(ops: list[OperatorRecord]) -> bool:
        return any(matches("attention_matmul_ops", o.operator_name) for o in ops)

    def decomposed(ops: list[OperatorRecord]) -> bool:  # SDPA's math path, decomposed by Inductor
        return any(matches("sdpa_math_softmax_ops", name) for o in ops for name in (o.operator_name,
                                                                                     *o.fused_operators))

    hits = {m for m, ops in by_module.items() if has_mm(ops) and any(_has_softmax(o) for o in ops) and not fused(ops)
            and _scores_then_values(ops) is not False}
    math_modules = {m for m in hits if decomposed(by_module[m])}
    hits -= math_modules
    keys = {_layer_key(m) for m in hits}
    hits |= {m for m, ops in by_module.items() if _layer_key(m) in keys and has_mm(ops) and not fused(ops)}
    findings = []
    if hits:
        ops = [o for m in sorted(hits) for o in by_module[m]]
        kernels = [k for o in ops for k in o.kernels]
        findings.append(Finding(
            kind="unfused_attention", title=f"attention as separate matmul/softmax kernels in {len(hits)} modules",
            operators=[o.operator_id for o in ops], module_paths=sorted(hits),
            kernel_ids=[k.kernel_id for k in kernels],
            triggers=[f"modules={len(hits)}", f"attention_kernels={len(kernels)}",
                      f"attention_kernel_time_ns={sum(k.duration_ns for k in kernels)}", "fused_attention_kernel=none"],
            detail="Attention runs as bmm + scale + mask + softmax + bmm (several kernels and launches per layer); "
                   "torch.nn.functional.scaled_dot_product_attention runs one fused flash/efficient kernel.",
        ))
    math_path = [o for o in profile.operators if matches("sdpa_ops", o.operator_name) and o.kernels
                 and not any(matches("fused_attention_kernels", k.kernel_name) for k in o.kernels)]
    math_path += [o for m in sorted(math_modules) for o in by_module[m] if o not in math_path
                  and (has_mm([o]) or _has_softmax(o))]
    if math_path:
        kernels = [k for o in math_path for k in o.kernels]
        calls = sum(1 for o in math_path if matches("sdpa_ops", o.operator_name))
        where = [f"{calls} calls" if calls else "", f"{len(math_modules)} modules, decomposed" if math_modules else ""]
        findings.append(Finding(
            kind="sdpa_math_path",
            title=f"scaled_dot_product_attention on its math path ({', '.join(w for w in where if w)})",
            operators=[o.operator_id for o in math_path], module_paths=_uniq([o.module_path for o in math_path]),
            kernel_ids=[k.kernel_id for k in kernels],
            triggers=[f"sdpa_kernels={len(kernels)}", "fused_attention_kernel=none"],
            detail="SDPA fell back to its math implementation (dtype, mask or head size unsupported by the flash/"
                   "efficient kernels): check dtype (FP16/BF16), head dim and the attn_mask (its last dimension must "
                   "be contiguous: a permuted bias needs .contiguous()).",
        ))
    return findings


def window_findings(profile: OperatorAttributedProfile, health: TimelineHealth) -> list[Finding]:
    """A host-bound window and a swarm of tiny kernels."""
    findings = []
    util = health.gpu_utilization_pct
    if health.kernel_count and util < rule("timeline", "low_utilisation_pct"):
        findings.append(Finding(
            kind="host_bound_window", title=f"GPU busy {util:.1f} % of the window",
            triggers=[f"gpu_utilization_pct={util:.1f}", f"idle_ns={health.idle_ns}",
                      f"launch_bound_kernel_pct={health.launch_bound_kernel_pct or 0:.0f}",
                      f"mean_gap_ns={health.mean_gap_ns or 0:.0f}"],
            detail="The GPU waits for the host between kernels: Python dispatch and launch overhead dominate.",
        ))
    tiny_pct = health.tiny_kernel_pct or 0.0
    if health.kernel_count and tiny_pct > rule("launch", "swarm_tiny_kernel_pct"):
        findings.append(Finding(
            kind="tiny_kernel_swarm", title=f"{health.tiny_kernel_count} of {health.kernel_count} kernels are tiny",
            triggers=[f"tiny_kernel_pct={tiny_pct:.0f}", f"kernel_count={health.kernel_count}",
                      f"mean_kernel_ns={health.mean_kernel_ns or 0:.0f}"],
            detail="Most kernels run shorter than a launch costs: fusion (torch.compile) and CUDA graphs remove them.",
        ))
    return findings


def structural_findings(profile: OperatorAttributedProfile, placed: list[Placed]) -> list[Finding]:
    """Unfolded batch norms, layout conversions, host syncs, separate q/k/v projections, forward work recomputed by
    activation checkpointing, register spills."""
    findings: list[Finding] = []
    ops = profile.operators
    inference = profile.capture_metadata.run_mode == "inference"
    pairs = [(a, b) for a, b in zip(ops, ops[1:], strict=False)
             if matches("conv_ops", a.operator_name) and matches("batch_norm_ops", b.operator_name)]
    if inference and pairs:
        bn_kernels = [k for _, b in pairs for k in b.kernels]
        findings.append(Finding(
            kind="conv_bn_unfolded", title=f"{len(pairs)} batch norms after convolutions run at inference",
            operators=[b.operator_id for _, b in pairs], module_paths=_uniq([b.module_path for _, b in pairs]),
            kernel_ids=[k.kernel_id for k in bn_kernels],
            triggers=[f"conv_bn_pairs={len(pairs)}", f"bn_kernel_time_ns={sum(k.duration_ns for k in bn_kernels)}"],
            detail="In eval mode a BatchNorm after a conv is an affine map: fold it into the conv's weights and bias.",
        ))
    fused_bn = [o for o in ops if o.is_fused and any(matches("batch_norm_ops", f) for f in o.fused_operators)]
    if inference and fused_bn:
        findings.append(Finding(
            kind="bn_not_frozen", title=f"{len(fused_bn)} compiled kernels still compute batch norm",
            operators=[o.operator_id for o in fused_bn], module_paths=_uniq([o.module_path for o in fused_bn]),
            kernel_ids=[k.kernel_id for o in fused_bn for k in o.kernels],
            triggers=[f"fused_bn_kernels={len(fused_bn)}"],
            detail="Inductor fused the batch norm into pointwise kernels but did not fold it into the conv weights: "
                   "torch._inductor.config.freezing = True folds it at compile time (inference only).",
        ))
    inductor = [p for p in placed if matches("layout_copy_kernels", p.kernel.kernel_name)]
    cudnn = [p for p in placed if matches("cudnn_layout_kernels", p.kernel.kernel_name) and not _one_d_conv(p.op)]
    layout = inductor + cudnn
    if layout:
        formats = _format_trigger([p.op for p in layout])
        who = " and ".join(([f"Inductor re-lays out NCHW tensors for channels_last convolutions ({len(inductor)} "
                             "kernels)"] if inductor else [])
                           + ([f"cuDNN converts NCHW tensors to NHWC and back around its tensor-core convolutions "
                               f"({len(cudnn)} kernels)"] if cudnn else []))
        findings.append(Finding(
            kind="layout_conversion", title=f"{len(layout)} kernels only convert conv inputs/weights between layouts",
            operators=_uniq([p.op.operator_id if p.op else None for p in layout]),
            module_paths=_uniq([p.kernel.module_path for p in layout]), kernel_ids=[p.kernel.kernel_id for p in layout],
            triggers=[f"layout_kernels={len(layout)}", f"cudnn_layout_kernels={len(cudnn)}",
                      f"kernel_time_ns={sum(p.kernel.duration_ns for p in layout)}",
                      *formats],
            detail=f"{who} on every call: convert the model and input to torch.{memory_format(formats)} once.",
        ))
    syncs = [o for o in ops if matches("sync_ops", o.operator_name) and not counted_repeats(o)]
    if syncs:
        findings.append(Finding(
            kind="host_sync", title=f"{len(syncs)} operators make the host wait for the GPU",
            operators=[o.operator_id for o in syncs], module_paths=_uniq([o.module_path for o in syncs]),
            kernel_ids=[k.kernel_id for o in syncs for k in o.kernels], triggers=[f"sync_ops={len(syncs)}"],
            detail="item()/nonzero()/data-dependent shapes synchronise: keep values on the GPU or move them out of "
                   "the hot loop.",
        ))
    findings += _qkv(ops) + _recomputed(ops)
    spills = [p for p in placed if (_v(p.kernel, "local_spill_bytes_ld") or 0) + (_v(p.kernel, "local_spill_bytes_st")
                                                                                   or 0) > 0]
    if spills:
        findings.append(Finding(
            kind="register_spills", title=f"{len(spills)} kernels spill registers to local memory",
            operators=_uniq([p.op.operator_id if p.op else None for p in spills]),
            module_paths=_uniq([p.kernel.module_path for p in spills]), kernel_ids=[p.kernel.kernel_id for p in spills],
            triggers=[f"kernels_with_spills={len(spills)}"],
            detail="Local-memory spills add memory traffic; for generated kernels lower the block size or tile.",
        ))
    return findings


def _qkv(ops: list[OperatorRecord]) -> list[Finding]:
    modules = {o.module_path for o in ops if o.module_path and matches("matmul_ops", o.operator_name)}
    hits: list[str] = []
    for triple in patterns().get("qkv_module_suffixes", []):
        for module in modules:
            parent, _, leaf = module.rpartition(".")
            if leaf == triple[0] and all((f"{parent}.{s}" if parent else s) in modules for s in triple[1:]):
                hits.append(parent or "(root)")
    if not hits:
        return []
    members = [o for o in ops if o.module_path and o.module_path.rpartition(".")[0] in hits
               and matches("matmul_ops", o.operator_name)]
    return [Finding(
        kind="separate_qkv", title=f"separate q/k/v projections in {len(hits)} modules",
        operators=[o.operator_id for o in members], module_paths=sorted(hits),
        kernel_ids=[k.kernel_id for o in members for k in o.kernels], triggers=[f"qkv_modules={len(hits)}"],
        detail="Three projections of the same input: one GEMM with concatenated weights does the work of three.",
    )]


def _recomputed(ops: list[OperatorRecord]) -> list[Finding]:
    """Forward work activation checkpointing runs again in the backward: the kernel time its saved memory costs."""
    again = [o for o in ops if o.recomputed]
    if not again:
        return []
    kernels = [k for o in again for k in o.kernels]
    spent = sum(k.duration_ns for k in kernels)
    total = sum(k.duration_ns for o in ops for k in o.kernels) or 1
    modules = _uniq([o.module_path for o in again])
    return [Finding(
        kind="recomputed_forward",
        title=f"activation checkpointing runs {len(again)} forward calls again in the backward: "
              f"{spent / 1e3:.1f} us, {100 * spent / total:.1f} % of kernel time",
        operators=[o.operator_id for o in again], module_paths=modules, kernel_ids=[k.kernel_id for k in kernels],
        triggers=[f"recomputed_calls={len(again)}", f"kernel_time_ns={spent}",
                  f"kernel_time_pct={100 * spent / total:.1f}"],
        detail="torch.utils.checkpoint saves the activations of the checkpointed modules by computing their forward "
               "twice: where memory allows, checkpoint fewer modules, or keep the costly outputs (selective "
               "checkpointing: torch.utils.checkpoint.create_selective_checkpoint_contexts saving the matmuls').",
    )]


def _opaque(p: Placed) -> bool:
    """The kernel belongs to an op Inductor calls as it is (patterns.yaml opaque_ops: cuDNN's RNNs, sorts...)."""
    return (p.op is not None and matches("opaque_ops", p.op.operator_name)) \
        or matches("opaque_ops", p.kernel.attribution.launch_op)


def _work(p: Placed) -> bool:
    """A GEMM, convolution or fused-attention kernel."""
    return gemm_kind(p.op, p.kernel) is not None or matches("fused_attention_kernels", p.kernel.kernel_name)


def work_kernels(placed: list[Placed]) -> set[int]:
    """The GEMM, convolution and fused-attention kernels, and the opaque ops' kernels: the work no fusion
    removes."""
    return {p.kernel.kernel_id for p in placed if _work(p) or _opaque(p)}


def fusible_kernels(placed: list[Placed]) -> set[int]:
    """Kernels torch.compile would fuse: element-wise, normalisation, reduction and copy kernels of eager
    operators (not GEMMs or convolutions, not fused attention, not host-syncing ops, not the kernels of ops
    Inductor calls as they are: patterns.yaml opaque_ops)."""
    return {
        p.kernel.kernel_id for p in placed
        if p.op is not None and not p.op.is_fused and not _work(p) and not matches("sync_ops", p.op.operator_name)
        and not _opaque(p)
    }


FORMAT_TRIGGER = "memory_format="


def _format_trigger(ops: Sequence[OperatorRecord | None]) -> list[str]:
    """`memory_format=channels_last_3d` where every convolution among `ops` takes a 5-d input (a 3-D convolution's:
    channels_last lays out 4-d tensors only), else nothing."""
    ranks = {len(op.input_shapes[0]) for op in ops if op is not None and op.input_shapes and op.input_shapes[0]}
    return [f"{FORMAT_TRIGGER}channels_last_3d"] if ranks == {5} else []


def memory_format(triggers: Sequence[str]) -> str:
    """The channels-last memory format a finding's convolutions take, by its triggers."""
    return next((t.removeprefix(FORMAT_TRIGGER) for t in triggers if t.startswith(FORMAT_TRIGGER)), "channels_last")
