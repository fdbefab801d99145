"""Ranked opportunities: each finding becomes a change with an Amdahl-bounded estimate of end-to-end saving.

Two kinds of saving, both upper bounds and labelled estimates:
- removing launches (fusion, folding, graphs, SDPA): a removed kernel gives back at most its *pitch*, the time
  from its start to the next kernel's start (its run plus the idle gap after it); the pitches of a window sum
  to less than the window, so no estimate can exceed it;
- speeding a kernel up (TF32/BF16, channels_last): a kernel shrinks at most to its new roofline time (counts
  over the new peak, at the clock it ran at) and not below `estimates.kernel_floor_ns`; the window shortens only
  by what kernels on the GPU's critical path save (the next kernel started within `timeline.critical_gap_ns`
  of their end) — in a host-bound window that is almost nothing, and the estimate says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from mcp_server.analysis.detect import memory_format
from mcp_server.analysis.devices import peak_at_clock
from mcp_server.analysis.host_compute import host_compute_left, host_compute_places, launch_idle
from mcp_server.analysis.pattern_registry import PATTERNS, PatternName, knowledge_of
from mcp_server.analysis.pooled_gemms import kept_kernel, pooled_chains
from mcp_server.analysis.rules import matches, rule
from mcp_server.analysis.shapes import gemm_flops_and_bytes, minimum_bytes
from mcp_server.analysis.syncs import SHORT_END, idle_wording, offloads
from mcp_server.analysis.timeline_health import Placed
from mcp_server.assemble.attribute import CAPTURED_DETAIL
from mcp_server.schema.analysis import DeviceSpec, Finding, KernelAnalysis, Opportunity, SyncPoint, TimelineHealth
from mcp_server.schema.profile import OperatorAttributedProfile

NOT_ADDITIVE = "; overlaps other launch-removing changes: savings are not additive"
# Operators of nn.RNNBase modules: Dynamo skips a whole frame that calls one (torch._dynamo.config.allow_rnn is off)
RNN_OPERATORS = frozenset({"aten::lstm", "aten::gru", "aten::rnn_tanh", "aten::rnn_relu"})


def _us(ns: float) -> str:
    return f"{ns / 1e3:.1f} us"


def _pitch(placed: dict[int, Placed], ids: Iterable[int]) -> int:
    return sum(placed[i].pitch_ns for i in ids if i in placed)


def _duration(placed: dict[int, Placed], ids: Iterable[int]) -> int:
    return sum(placed[i].kernel.duration_ns for i in ids if i in placed)


def _removal(placed: dict[int, Placed], groups: list[list[int]], keep_one: bool) -> tuple[int, int]:
    """(end-to-end, kernel-time) savings when each group's kernels go away (or become one kernel)."""
    floor = rule("estimates", "kernel_floor_ns") if keep_one else 0
    e2e = sum(max(0, _pitch(placed, g) - floor) for g in groups)
    kernel = sum(max(0, _duration(placed, g) - floor) for g in groups)
    return int(e2e), int(kernel)


def _speedup(placed: dict[int, Placed], analyses: dict[int, KernelAnalysis], ids: list[int],
             device: DeviceSpec | None, target: str, bytes_ratio: float) -> tuple[int, int]:
    """(end-to-end, kernel-time) savings when kernels move to the `target` precision's roof."""
    floor = rule("estimates", "kernel_floor_ns")
    e2e = kernel_total = 0.0
    for kid in ids:
        p, ka = placed.get(kid), analyses.get(kid)
        if p is None:
            continue
        t = p.kernel.duration_ns
        new = min(t, floor)
        roof = ka.roofline if ka else None
        model = gemm_flops_and_bytes(p.op) if p.op is not None and not p.kernel.metrics else None
        if model and device:
            # No counters: the operator's model FLOPs and minimum bytes at the new peak (published clock).
            peak, bandwidth = peak_at_clock(device, target, None), device.dram_bandwidth_bytes_per_s
            if peak:
                seconds = max(model[0] / peak, model[1] * bytes_ratio / bandwidth if bandwidth else 0.0)
                new = min(t, max(floor, seconds * 1e9))
        elif roof and device and roof.ncu_duration_ns and roof.flop > 0:
            peak = peak_at_clock(device, target, roof.sm_clock_mhz)
            bandwidth = device.dram_bandwidth_bytes_per_s
            if peak:  # the kernel's own DRAM traffic is no floor (a tensor-core kernel tiles differently):
                seconds = roof.flop / peak  # the FLOPs at the new peak, and the bytes its shapes must move
                minimum = minimum_bytes(p.op) if p.op is not None else None
                if bandwidth and minimum:
                    seconds = max(seconds, minimum * bytes_ratio / bandwidth)
                new = min(t, max(floor, t * seconds * 1e9 / roof.ncu_duration_ns))
        saving = t - new
        kernel_total += saving
        e2e += saving if p.critical else 0.0
    return int(e2e), int(kernel_total)


def _target_precision(device: DeviceSpec | None) -> str:
    if device and "tf32_tensor" in device.peak_flop_per_s:
        return "tf32_tensor"
    return "bf16_tensor"


def _worth(saving_ns: int, window: int) -> bool:
    """A saving large enough to be an opportunity of its own (bottleneck_rules.yaml estimates.min_saving_pct)."""
    return 100.0 * saving_ns / window >= rule("estimates", "min_saving_pct")


def _joined(first: Opportunity, title: str, finding: Finding, e2e: int, kernel: int, label: str,
            window: int) -> Opportunity:
    """One opportunity for one change that two findings call for: their kernels are disjoint, so the upper bounds
    add (at most the window)."""
    saving = min(first.estimated_saving_ns + e2e, window)
    return first.model_copy(update={
        "title": f"{title}; {first.title[:1].lower()}{first.title[1:]}",
        "operators": _merge([first.operators, finding.operators]),
        "module_paths": _merge([first.module_paths, finding.module_paths]),
        "triggers": _merge([first.triggers, finding.triggers]),
        "kernel_time_saving_ns": first.kernel_time_saving_ns + kernel, "estimated_saving_ns": saving,
        "estimated_saving_pct": 100.0 * saving / window, "estimate_label": f"{label}; and {first.estimate_label}",
        "findings": [*first.findings, finding.kind],
    })


def _chains(placed: list[Placed], fusible: set[int]) -> list[list[int]]:
    chains, run = [], []
    for p in placed:
        if p.kernel.kernel_id in fusible:
            run.append(p.kernel.kernel_id)
        else:
            if len(run) > 1:
                chains.append(run)
            run = []
    if len(run) > 1:
        chains.append(run)
    return chains


def _runs(profile: OperatorAttributedProfile, finding: Finding) -> list[list[int]]:
    """Kernel ids of the finding grouped into runs of consecutive operators (one attention block per run).

    Runs, not module paths: Inductor reuses one generated kernel across layers and its provenance then names
    the first layer's module for every layer."""
    wanted = set(finding.kernel_ids)
    groups: list[list[int]] = []
    open_run = False
    for op in profile.operators:
        ids = [k.kernel_id for k in op.kernels if k.kernel_id in wanted]
        if ids and open_run:
            groups[-1].extend(ids)
        elif ids:
            groups.append(ids)
        open_run = bool(ids)
    return groups


def _captured(profile: OperatorAttributedProfile) -> bool:
    """Whether the window replays a CUDA graph the workload captured itself (kernels attributed through the
    capture's ranges): its call is one graph already, as far as it chose."""
    return any(k.attribution.detail == CAPTURED_DETAIL for op in profile.operators for k in op.kernels)


def _whole_call(add: Callable[..., None], placed: list[Placed], health: TimelineHealth, mode: str,
                trees: bool, compiled: bool) -> bool:
    """An optimized or compiled window whose kernels run close together but whose call leaves the GPU idle around
    them: the host work of each call (Dynamo's guards, CUDA graph trees' checks, input and output handling; an eager
    recipe's Python and dispatch) is the idle time, and one torch.cuda.CUDAGraph replayed for the whole call leaves a
    copy in, a replay and a copy out. Whether it was offered."""
    inner = sum(p.gap_before_ns for p in placed[1:])
    around = min(max(0, health.idle_ns - inner), launch_idle(health))
    if around <= inner or around * 100 < rule("timeline", "whole_call_idle_pct") * max(health.window_ns, 1):
        return False
    host = ("Dynamo's guards, CUDA graph trees' checks, input handling" if trees
            else "Dynamo's guards, the compiled code's own calls, input handling" if compiled
            else "the eager call's Python and dispatch, input handling")  # an eager recipe compiles nothing
    add(f"Replay the whole call from one torch.cuda.CUDAGraph: {_us(around)} of host work around the kernels "
        f"({host}) keeps the GPU idle", "whole_forward_graph",
        PATTERNS["whole_forward_graph"].answers, around, 0,
        "estimate (upper bound): the idle time before and after the window's kernels goes, "
        + ("measured without the profiler" if health.unprofiled else "inflated by profiler instrumentation: no "
           "timing pass ran")
        + f" ({_us(inner)} between kernels stays); an input copy, one replay and an output copy remain"
        + NOT_ADDITIVE, modules=["(whole window)"],
        triggers=[f"idle_around_kernels_ns={around}", f"idle_between_kernels_ns={inner}", f"compile_mode={mode}",
                  f"cuda_graph_trees={trees}"])
    return True


def build_opportunities(
    profile: OperatorAttributedProfile, placed: list[Placed], analyses: dict[int, KernelAnalysis],
    findings: list[Finding], health: TimelineHealth, device: DeviceSpec | None, fusible: set[int],
    needs: list[str] | None = None, syncs: list[SyncPoint] | None = None, model_needs: list[str] | None = None,
) -> list[Opportunity]:
    """Opportunities from the findings, ranked by estimated end-to-end saving.

    `needs`: the changes that must come before a CUDA graph or a whole-graph compile of the window (its host
    synchronisations, data-dependent shapes): such advice names the first of them in its title and lists them all.
    `syncs`: the window's synchronising places, whose idle time removing them gives back. `model_needs`: what must
    come before the model alone is compiled or one decode step captured (those of `needs` inside its modules: a
    stop check between decode steps, a script's `loss.item()` stay)."""
    needs = needs or []
    model_needs = model_needs or []
    by_id = {p.kernel.kernel_id: p for p in placed}
    window = max(health.window_ns, 1)
    mode = profile.capture_metadata.compile_mode
    compiled = any(op.compiled_graph for op in profile.operators)
    if mode in ("inductor", "cudagraphs") and not compiled:
        mode = "eager"  # Dynamo compiled nothing of the window (it skipped the model): its advice is eager code's
    kinds = {f.kind: f for f in findings}
    out: list[Opportunity] = []

    def add(title: str, cls: PatternName, finding_kinds: Iterable[str], e2e: int, kernel: int, label: str,
            ops: list[str] | None = None, modules: list[str] | None = None, triggers: list[str] | None = None) -> None:
        found = [kinds[k] for k in finding_kinds if k in kinds]
        out.append(Opportunity(
            rank=0, title=title, change_class=cls,
            operators=ops if ops is not None else _merge(f.operators for f in found),
            module_paths=modules if modules is not None else _merge(f.module_paths for f in found),
            triggers=triggers if triggers is not None else _merge(f.triggers for f in found),
            kernel_time_saving_ns=kernel, estimated_saving_ns=e2e, estimated_saving_pct=100.0 * e2e / window,
            estimate_label=label, knowledge=knowledge_of(cls), findings=[f.kind for f in found],
        ))

    def add_or_join(title: str, cls: PatternName, finding: Finding, e2e: int, kernel: int, label: str) -> None:
        """`add`, or, when an opportunity of the same change is there already (channels_last for FP32 convolutions
        and for layout copies, BF16 autocast for GEMMs and for convolutions), that one joined with this evidence."""
        same = next((o for o in out if o.change_class == cls), None)
        if same is None:
            add(title, cls, [finding.kind], e2e, kernel, label)
        elif _worth(e2e, window):
            out[out.index(same)] = _joined(same, title, finding, e2e, kernel, label, window)

    host_bound = "host_bound_window" in kinds or "tiny_kernel_swarm" in kinds
    growing = kinds.get("growing_kv_cache")
    # torch.compile cannot reach an eager forward that calls an RNN module: Dynamo skips the frame
    rnns = [op for op in profile.operators if op.operator_name in RNN_OPERATORS] if mode == "eager" else []
    trees = mode == "cudagraphs" or bool(profile.capture_metadata.cuda_graph_trees)
    # a window replaying CUDA graphs already is offered none again, unless its cache grows (graphs per length)
    if host_bound and placed and (growing is not None or not (trees or _captured(profile))):
        gap = rule("estimates", "graph_kernel_gap_ns")
        graphed = placed[1:]
        title = ("Capture the window in CUDA graphs: torch.compile(mode='reduce-overhead')" if mode == "eager"
                 else "Replay the compiled graph with CUDA graphs: mode='reduce-overhead'")
        cls: PatternName = "whole_forward_graph" if rnns else "cuda_graphs"
        if rnns and profile.capture_metadata.run_mode == "train_step":  # the whole-forward graph drops autograd
            cls, title = "graphed_training", (
                f"Replay the model's forward and backward from CUDA graphs, its {len(rnns)} RNN call(s) included: "
                "torch.cuda.make_graphed_callables (Dynamo skips a forward that calls an RNN module, so "
                "mode='reduce-overhead' cannot)")
            # the loss and the optimizer keep their launches: only the gaps of the graphed phases are counted
            graphed = [p for p in graphed
                       if p.op is not None and p.op.phase in ("forward", "backward") and p.op.module_path]
        elif rnns:
            title = (f"Capture the whole forward in one CUDA graph, its {len(rnns)} RNN call(s) included "
                     "(Dynamo skips a forward that calls an RNN module, so mode='reduce-overhead' cannot)")
        elif growing is not None:  # the cache is the prerequisite, and the pattern makes it
            cls, title = "static_kv_cache", ("Preallocate the KV cache at its final length and replay each decode "
                                             f"step from one CUDA graph: {growing.title}")
        e2e = min(int(sum(max(0, p.gap_before_ns - gap) for p in graphed)), launch_idle(health))
        add(title, cls, [*PATTERNS[cls].answers, *PATTERNS["cuda_graphs"].answers], e2e, 0,
            f"estimate (upper bound): every idle gap between kernels shrinks to ~{_us(gap)} under graph replay "
            f"(assumed; the {_us(placed[0].gap_before_ns)} before the first kernel is not counted); "
            + ("gaps measured without the profiler" if health.unprofiled else "gaps inflated by profiler "
               "instrumentation: no timing pass ran") + host_compute_left(health) + NOT_ADDITIVE,
            modules=["(whole window)"],
            triggers=_merge([*(kinds[k].triggers for k in ("host_bound_window", "tiny_kernel_swarm") if k in kinds),
                             [f"rnn_operators={len(rnns)}"]]) if rnns else None)
        _after(out[-1], model_needs if cls == "static_kv_cache" else needs)
    # the graph trees' own captures are no whole-call graph; a workload's own capture is as far as it chose
    if (mode in ("cudagraphs", "optimized") and not rnns and placed and (trees or not _captured(profile))
            and _whole_call(add, placed, health, mode, trees, compiled)):
        _after(out[-1], needs)
    chains = _chains(placed, fusible) if mode == "eager" and fusible else []
    if chains:
        # upper bound: every fusible kernel may fuse into a neighbour, and Inductor may run the convolutions
        # channels-last, without cuDNN's layout conversions
        layouts = [p for p in placed if matches("cudnn_layout_kernels", p.kernel.kernel_name)]
        # and Inductor's pattern matcher rewrites unfused attention (matmul, softmax, matmul) to fused SDPA
        attention = {i for kind in ("unfused_attention", "sdpa_math_path") if kind in kinds
                     for group in _runs(profile, kinds[kind]) for i in group if i in by_id and i not in fusible}
        kernel = (sum(by_id[i].kernel.duration_ns for i in fusible) + sum(p.kernel.duration_ns for p in layouts)
                  + sum(by_id[i].kernel.duration_ns for i in attention))
        if host_bound and not rnns:  # compiled code launches with far less host work: every gap may shrink
            inner = min(sum(p.gap_before_ns for p in placed[1:]), launch_idle(health))
            e2e = min(inner + kernel, max(0, health.window_ns - placed[0].gap_before_ns))
            how = (f"and the compiled code's launches cost the host less, so every idle gap between kernels may "
                   f"shrink ({_us(inner)} of them, "
                   + ("measured without the profiler" if health.unprofiled else "inflated by instrumentation")
                   + host_compute_left(health) + ")")
            swarm = kinds["tiny_kernel_swarm"] if "tiny_kernel_swarm" in kinds else kinds["host_bound_window"]
            triggers = [*swarm.triggers]
        elif rnns:  # Dynamo compiles only the submodules around the RNNs: no launch gap is the compiler's to remove
            e2e, how, triggers = kernel, ("Dynamo skipping the forward that calls the RNN (compile the submodules "
                                          "around it): no idle gap is counted"), [f"rnn_operators={len(rnns)}"]
        else:  # the GPU is the critical path: the memory passes fusion removes shorten it
            e2e, how, triggers = kernel, "the GPU being the critical path", []
        add(f"Fuse {len(fusible)} element-wise/normalisation kernels with torch.compile (Inductor)",
            "inductor_config", PATTERNS["inductor_config"].answers, e2e, kernel,
            f"estimate (upper bound): the {len(fusible)} element-wise/normalisation kernels' time fuses away into "
            f"their neighbours{f' and cuDNN drops its {len(layouts)} layout conversions' if layouts else ''}"
            f"{f', the {len(attention)} unfused attention GEMMs become fused attention' if attention else ''}, "
            f"{how}{NOT_ADDITIVE}", modules=["(whole window)"],
            triggers=[*triggers, f"fusible_kernels={len(fusible)}", f"fusion_groups={len(chains)}",
                      f"cudnn_layout_kernels={len(layouts)}", f"attention_kernels={len(attention)}"])
        if host_bound and not rnns:  # the model compiled (dynamic shapes: a growing cache needs no change first)
            _after(out[-1], model_needs)
    target = _target_precision(device)
    precision: tuple[tuple[str, PatternName], ...] = (("fp32_matmul", "dtype_autocast"), ("fp32_conv", "channels_last"))
    for kind, cls in precision:
        finding = kinds.get(kind)
        if finding is None:
            continue
        if kind == "fp32_conv" and "layout=NCHW" not in finding.triggers:
            cls = "dtype_autocast"
        e2e, kernel = _speedup(by_id, analyses, finding.kernel_ids, device, target, 1.0)
        what = "GEMMs" if kind == "fp32_matmul" else "convolutions"
        if kind == "fp32_matmul":
            how = "BF16 autocast or TF32 scoped to the model (reduced precision tier)"
        elif cls == "channels_last":
            how = f"{memory_format(finding.triggers)} lets cuDNN pick TF32 kernels; BF16 autocast goes further"
        else:
            how = "BF16 autocast (cuDNN chose FP32 kernels for these shapes although TF32 is allowed)"
        later = (f"; the GPU waits on the host after these kernels, so the {_us(kernel)} of kernel time counts "
                 "end to end only once launch overhead is removed") if e2e < kernel / 2 else ""
        math = kinds.get("sdpa_math_path")
        upcast = len(set(finding.kernel_ids) & set(math.kernel_ids)) if math is not None else 0
        if upcast:  # SDPA's math path computes half inputs in float32
            later += (f"; {upcast} of them are scaled_dot_product_attention's math path, which computes half inputs "
                      "in float32: a fused attention kernel removes them instead")
        title = f"Run {len(finding.kernel_ids)} FP32 {what} on tensor cores: {how}"
        label = (f"estimate (upper bound): each kernel shrinks to its {target.replace('_', ' ')} roofline time (its "
                 "FLOPs at that peak, and the bytes its shapes must move: a GEMM's operands and result, a "
                 "convolution's input and weight; the FP32 kernel's own DRAM traffic is no floor, a tensor-core "
                 "kernel tiles differently), not below "
                 f"{_us(rule('estimates', 'kernel_floor_ns'))}; only kernels on the GPU critical path shorten the "
                 f"window{later}")
        add_or_join(title, cls, finding, e2e, kernel, label)
    half = kinds.get("half_matmul")
    if half is not None and device is not None and "fp8_tensor" in device.peak_flop_per_s:
        e2e, kernel = _speedup(by_id, analyses, half.kernel_ids, device, "fp8_tensor", 0.5)
        held = set(half.operators)
        fastpath = sorted({o.operator_name for o in profile.operators
                           if o.operator_id in held and matches("transformer_fastpath_ops", o.operator_name)})
        add(f"Run {len(half.kernel_ids)} BF16/FP16 GEMMs as FP8 GEMMs: torch._scaled_mm with per-tensor scales "
            "(fp8 precision tier)", "fp8_linear", ["half_matmul"], e2e, kernel,
            "estimate (upper bound): each GEMM shrinks to its FLOPs at the FP8 tensor-core peak and half its operands' "
            f"bytes, not below {_us(rule('estimates', 'kernel_floor_ns'))}; the per-call quantization of each input "
            "(one reduction, one cast) is not counted; only kernels on the GPU critical path shorten the window")
        if fastpath:
            _after(out[-1], [f"turn PyTorch's transformer fast path off{SHORT_END}the GEMMs of "
                             f"{', '.join(f'`{n}`' for n in fastpath)} run inside its fused native layers, which read "
                             "the linear layers' weights themselves, so no module swap reaches them until "
                             "torch.backends.mha.set_fastpath_enabled(False); that change costs time of its own: "
                             "bench it alone first"])
    split = kinds.get("split_fusion")
    if split is not None:
        e2e, kernel = _removal(by_id, _runs(profile, split), keep_one=True)
        add(f"Run each chain as one Triton op registered with torch.library: {split.title}", "triton_op",
            ["split_fusion"], e2e, kernel,
            "estimate (upper bound): each chain's kernels and the idle time between them become one kernel of at "
            f"least {_us(rule('estimates', 'kernel_floor_ns'))}")
    pooled = kinds.get("pooled_gemm_output")
    if pooled is not None:
        e2e, kernel = _removal(by_id, [[p.kernel.kernel_id for p in c if p.kernel.kernel_id != kept_kernel(c)]
                                       for c in pooled_chains(placed)], keep_one=False)
        add(f"Max-pool in the GEMM's epilogue, one Triton kernel per chain: {pooled.title}", "max_epilogue",
            ["pooled_gemm_output"], e2e, kernel,
            "estimate: the pooling kernel and the kernels between go into the GEMM's epilogue and the GEMM keeps its "
            "time (its output's write, which also goes, not counted; a Triton GEMM may be slower than the library's)")
    heuristic = kinds.get("heuristic_conv")
    if heuristic is not None:
        e2e, kernel = _removal(by_id, [[i] for i in heuristic.kernel_ids], keep_one=True)
        add(f"Let cuDNN time its algorithms: torch.backends.cudnn.benchmark = True ({heuristic.title})",
            "cudnn_benchmark", ["heuristic_conv"], e2e, kernel,
            "estimate (upper bound): each kernel down to the floor; cuDNN times each new input shape once (the first "
            "steps pay it, and a shape that changes every step pays it every step)")
    for kind in ("unfused_attention", "sdpa_math_path"):
        if kind in kinds:
            groups = _runs(profile, kinds[kind])
            e2e, kernel = _removal(by_id, groups, keep_one=True)
            # A block is a forward run through a softmax: the runs around it are its module's layout copies and
            # residual adds, and a backward's runs interleave with the other gradients' work.
            softmax = {k.kernel_id for op in profile.operators if op.phase != "backward"
                       and "softmax" in op.operator_name for k in op.kernels}
            blocks = [g for g in groups if softmax.intersection(g)]
            wanted = set(kinds[kind].kernel_ids)
            backward = any(op.phase == "backward" and any(k.kernel_id in wanted for k in op.kernels)
                           for op in profile.operators)
            n, and_backward = len(blocks) or len(groups), " and their backward" if backward else ""
            add(f"Replace {n} attention blocks{and_backward} by F.scaled_dot_product_attention (one fused kernel each)"
                if kind == "unfused_attention" else f"Put {n} scaled_dot_product_attention calls{and_backward} on a "
                "fused kernel: half-precision inputs, a supported head size, an attn_mask with a contiguous last "
                "dimension",
                "sdpa_substitution", [kind], e2e, kernel,
                "estimate (upper bound): each attention block's kernels and the idle time between them become one "
                f"fused kernel of at least {_us(rule('estimates', 'kernel_floor_ns'))}")
    removals: tuple[tuple[str, PatternName, str], ...] = (
        ("conv_bn_unfolded", "conv_bn_fold", "Fold {n} batch norms into the preceding convolutions"),
                ("layout_conversion", "channels_last", "Convert model and input to {fmt} once ({n} copies)"),
                ("separate_qkv", "qkv_fusion", "Fuse separate q/k/v projections into one GEMM ({n} kernels)"))
    for kind, cls, title in removals:
        finding = kinds.get(kind)
        if finding is None:
            continue
        ids = finding.kernel_ids if kind != "separate_qkv" else _qkv_removable(profile, finding)
        e2e, kernel = _removal(by_id, [[i] for i in ids], keep_one=False)
        add_or_join(title.format(n=len(ids), fmt=memory_format(finding.triggers)), cls, finding, e2e, kernel,
                    "estimate (upper bound): the removed kernels give back their run time and the idle time after them")
    breaks = profile.capture_metadata.graph_breaks or []
    if breaks and placed:
        e2e, triggers = _graph_boundaries(placed, health)
        where = ", ".join(dict.fromkeys(b.location.rsplit("/", 1)[-1] for b in breaks))
        skipped = "compiled_graphs=0" in triggers
        label = ("estimate (upper bound): the GPU idle time at the boundaries between compiled graphs, "
                 + ("measured without the profiler" if health.unprofiled else "inflated by profiler instrumentation: "
                    "no timing pass ran") + "; fusions across a boundary and CUDA graphs over the whole forward come "
                 "on top and are not counted")
        title = (f"Make the model compile: Dynamo ran it eagerly after {len(breaks)} graph break(s) it could not "
                 f"handle ({where})" if skipped
                 else f"Remove {len(breaks)} graph break(s) so the model compiles to one graph ({where})")
        # a model compiled and skipped whole runs eagerly: compiling it is what the eager fusion advice asks for
        fusion = next((o for o in out if o.change_class == "inductor_config"), None) if skipped else None
        if fusion is not None:
            out.remove(fusion)
            title += f", then Inductor fuses {len(fusible)} element-wise/normalisation kernels"
            e2e, label, triggers = fusion.estimated_saving_ns, fusion.estimate_label, [*triggers, *fusion.triggers]
        add(title, "graph_breaks", fusion.findings if fusion else [], e2e,
            fusion.kernel_time_saving_ns if fusion else 0, label, ops=[],
            modules=["(whole window)"], triggers=[f"graph_breaks={len(breaks)}", *triggers,
                                                  *(f"break at {b.location}: {b.reason}" for b in breaks)])
        _after(out[-1], needs)  # one graph needs the break's cause gone: a synchronisation, a data-dependent shape
    computing = kinds.get("host_compute")
    if computing is not None:
        add(f"Move the host's own compute to the GPU, or overlap it with the GPU's work: "
            f"{health.host_compute_ns / 1e6:.1f} ms in operators that launch nothing ({host_compute_places(profile)})",
            "host_compute", ["host_compute"], health.host_compute_ns, 0,
            "estimate (upper bound): the host's compute in operators that launch nothing, under the profiler, at "
            "most the window's idle time; on the GPU that work costs GPU time instead, overlapped it still runs",
            ops=[], modules=computing.module_paths, triggers=computing.triggers)
    waiting = [p for p in syncs or [] if p.synchronizing and p.idle_after_ns]
    if waiting:
        idle = min(sum(p.idle_after_ns or 0 for p in waiting), launch_idle(health))
        source = waiting[0].idle_source
        add(f"Remove {sum(p.count for p in waiting)} host synchronisation(s) at {len(waiting)} place(s): "
            + ", ".join(_site(p) for p in waiting[:3]) + (" ..." if len(waiting) > 3 else "") + offloads(waiting),
            "host_syncs", ["host_sync"], idle, 0,
            "estimate (upper bound): the GPU idle time after each synchronising call, "
            + idle_wording(source)
            + "; the host still launches the work after it" + host_compute_left(health), ops=[],
            modules=list(dict.fromkeys(p.module_path for p in waiting if p.module_path)),
            triggers=[f"{_site(p)}: {p.api} x{p.count}, idle_after_ns={p.idle_after_ns}" for p in waiting[:5]])
    busy = max(health.gpu_busy_ns, 1)
    keep = [o for o in out if o.estimated_saving_pct >= rule("estimates", "min_saving_pct")
            or 100.0 * o.kernel_time_saving_ns / busy >= rule("estimates", "min_kernel_saving_pct")
            or o.change_class == "graph_breaks"]  # a break is always worth knowing about
    keep.sort(key=lambda o: (-o.estimated_saving_ns, -o.kernel_time_saving_ns))
    keep = keep[: int(rule("estimates", "max_opportunities"))]
    for rank, opportunity in enumerate(keep, 1):
        opportunity.rank = rank
    return keep


def _after(opportunity: Opportunity, needs: list[str]) -> None:
    """A change that applies only once something else has changed (a CUDA-graph or whole-graph-compile change on a
    window that synchronises or has data-dependent shapes, FP8 GEMMs inside the transformer fast path): the title
    names what must come first, and every prerequisite is listed."""
    if needs:
        opportunity.prerequisites = list(needs)
        opportunity.title += f" — first {needs[0].split(SHORT_END)[0]}"
        opportunity.estimate_label += "; only after its prerequisites (see prerequisites)"


def _site(point: SyncPoint) -> str:
    return point.call_site.rsplit("/", 1)[-1] if point.call_site else point.operator_name or point.api


def _merge(lists: Iterable[list[str]]) -> list[str]:
    return list(dict.fromkeys(v for values in lists for v in values))


def _qkv_removable(profile: OperatorAttributedProfile, finding: Finding) -> list[int]:
    """Kernels of the k and v projections (the q projection's GEMM stays, widened)."""
    wanted = set(finding.operators)
    seen: set[str] = set()
    ids = []
    for op in profile.operators:
        if op.operator_id not in wanted or not op.module_path:
            continue
        parent = op.module_path.rpartition(".")[0]
        if parent in seen:
            ids += [k.kernel_id for k in op.kernels]
        seen.add(parent)
    return ids


def _graph_boundaries(placed: list[Placed], health: TimelineHealth) -> tuple[int, list[str]]:
    """(idle GPU time before each forward kernel that starts another compiled graph or leaves one, triggers)."""
    forward = [p for p in placed if p.op is not None and p.op.phase in (None, "forward")]
    graphs = [p.op.compiled_graph if p.op is not None else None for p in forward]
    compiled = [i for i, g in enumerate(graphs) if g is not None]
    if not compiled:
        return 0, ["compiled_graphs=0"]
    first, last = compiled[0], compiled[-1]
    boundaries = [i for i in range(first + 1, last + 1) if graphs[i] != graphs[i - 1]]
    between = [forward[i] for i in range(first, last + 1) if graphs[i] is None]
    idle = sum(forward[i].gap_before_ns for i in boundaries)
    return int(idle), [f"compiled_graphs={len({g for g in graphs if g})}", f"graph_boundaries={len(boundaries)}",
                       f"boundary_idle_ns={int(idle)}", f"kernels_between_graphs={len(between)}",
                       f"kernel_time_between_graphs_ns={sum(p.kernel.duration_ns for p in between)}"]
