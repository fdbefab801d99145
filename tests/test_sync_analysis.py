"""The analysis of host synchronisations: each place named with its line and the idle time after it, and no CUDA
graph or whole-graph compile advice for a window that synchronises or has data-dependent shapes without the change
that must come first. On a run recorded on an H100 (an `.item()` between compiled graphs), on a training step recorded
on an H200 (activations offloaded to the host by a saved-tensor hook) and on a tiny inline MoE-like window (routing
with `nonzero`)."""

from __future__ import annotations

import pytest
from fixtures_util import extract_fixture

from mcp_server.analysis import analyze_profile
from mcp_server.backends.registry import assemble
from mcp_server.rundir import RunDir
from mcp_server.schema.profile import (
    Attribution,
    AttributionMethod,
    CaptureMetadata,
    Confidence,
    KernelRecord,
    OperatorAttributedProfile,
    OperatorRecord,
    RuntimeEvent,
    WindowTotals,
)


@pytest.fixture(scope="module")
def breaks(tmp_path_factory):
    run = extract_fixture("h100_graph_breaks_inductor", tmp_path_factory) / "graph_breaks_inductor"
    return assemble(RunDir(run))


def test_the_item_between_graphs_is_named_costed_and_comes_before_cuda_graphs(breaks, tmp_path):
    analysis = analyze_profile(breaks, tmp_path, measure=False)
    assert analysis.schema_version == "1.7"
    waiting = [p for p in analysis.syncs or [] if p.synchronizing]
    assert len(waiting) == 1
    item = waiting[0]
    sync = next(e for e in breaks.runtime_events or [] if e.api == "cudaStreamSynchronize")
    assert item.call_site is not None and item.call_site.endswith("graph_breaks.py:23")
    assert (item.api, item.operator_name, item.count, item.data_dependent) == ("cudaStreamSynchronize", "aten::item",
                                                                               1, True)
    assert item.idle_after_ns == sync.unprofiled_idle_after_ns == 126428 and item.idle_source == "unprofiled"
    graphs = next(o for o in analysis.opportunities if o.change_class == "cuda_graphs")
    assert graphs.title.endswith("— first move the .item() read(s) at graph_breaks.py:23 out of the loop")
    assert any("capture_scalar_outputs" in need for need in graphs.prerequisites)
    breaks = next(o for o in analysis.opportunities if o.change_class == "graph_breaks")
    assert breaks.prerequisites == graphs.prerequisites, "one graph needs the .item() gone as well"
    removal = next(o for o in analysis.opportunities if o.change_class == "host_syncs")
    assert removal.estimated_saving_ns == 126428 and removal.knowledge == "knowledge/fx_patterns/host_syncs.md"
    finding = next(f for f in analysis.findings if f.kind == "host_sync")
    assert "host_syncs=1" in finding.triggers and "sync_idle_ns=126428" in finding.triggers
    assert not item.offloaded, "the user's own read of a value"


def test_activations_offloaded_synchronously_are_told_apart_from_the_workloads_own_reads(tmp_path_factory, tmp_path):
    """`h200_offload_hooks_train.tar.xz` (see `tests/test_hooks_in_backward.py`): under torch 2.11 `save_on_cpu`
    copies each tensor autograd saves to the host inside the operator that saves it, and the H200's timeline shows a
    `cudaStreamSynchronize` in each copy (112 in the step, 21.3 ms of idle GPU measured without the profiler). Named
    at the forward's lines as they were, they read as the model's own reads; they are the offload's."""
    run = extract_fixture("h200_offload_hooks_train", tmp_path_factory) / "offload_hooks_train"
    analysis = analyze_profile(assemble(RunDir(run)), tmp_path, measure=False)
    waiting = [p for p in analysis.syncs or [] if p.synchronizing]
    offloaded = [p for p in waiting if p.offloaded]
    assert sum(p.count for p in offloaded) == 112 and sum(p.count for p in waiting) == 112
    assert {p.operator_name for p in offloaded} >= {"aten::layer_norm", "aten::linear", "aten::embedding"}
    graphs = next(o for o in analysis.opportunities if o.change_class == "cuda_graphs")
    assert graphs.prerequisites == [
        "make the offload of saved activations asynchronous (112 synchronising copies to the host inside the "
        "forward's operators) — a saved-tensor hook that copies into pinned memory with non_blocking=True, or offload "
        "fewer tensors (save_on_cpu around the largest activations only)"]
    removal = next(o for o in analysis.opportunities if o.change_class == "host_syncs")
    assert removal.title.endswith("(112 of them copy saved activations to the host: a saved-tensor hook's offload)")


def _kernel(kernel_id: int, start_ns: int, launch_op: str, gap_ns: int) -> KernelRecord:
    return KernelRecord(kernel_id=kernel_id, kernel_name=f"k{kernel_id}", start_ns=start_ns, duration_ns=2_000,
                        unprofiled_gap_ns=gap_ns, phase="forward",
                        attribution=Attribution(method=AttributionMethod.NVTX_ENCLOSURE, confidence=Confidence.MEDIUM,
                                                launch_op=launch_op))


def _moe_window() -> OperatorAttributedProfile:
    """Eight experts routed with nonzero: each expert's nonzero copies its count back and waits for it (moe.py:41),
    then its GEMM runs; tiny kernels, long host gaps."""
    operators, events, start = [], [], 0
    for expert in range(8):
        nonzero = _kernel(2 * expert, start, "aten::nonzero", 20_000)
        gemm = _kernel(2 * expert + 1, start + 60_000, "aten::addmm", 50_000)
        operators += [
            OperatorRecord(operator_id=f"aten::nonzero#{expert}", operator_name="aten::nonzero", call_index=expert,
                           module_path="experts", kernels=[nonzero], phase="forward", call_site="/w/moe.py:41"),
            OperatorRecord(operator_id=f"aten::linear#{expert}", operator_name="aten::linear", call_index=expert,
                           module_path=f"experts.{expert}", kernels=[gemm], phase="forward",
                           call_site="/w/moe.py:43")]
        events.append(RuntimeEvent(
            event_id=expert, kind="sync", api="cudaStreamSynchronize", start_ns=start + 3_000, duration_ns=4_000,
            synchronizing=True, origin="workload", operator_id=f"aten::nonzero#{expert}",
            operator_name="aten::nonzero", launch_op="aten::nonzero", module_path="experts",
            call_site="/w/moe.py:41", phase="forward", next_kernel_id=2 * expert + 1, idle_after_ns=55_000,
            unprofiled_idle_after_ns=50_000))
        start += 120_000
    meta = CaptureMetadata(tool="nsys", gpu_used=True, device_name="NVIDIA H100 80GB HBM3", device_type="cuda",
                           torch_version="2.11", python_version="3.12", python_executable="/none/python",
                           workload="/w/moe.py", compile_mode="eager", run_mode="inference", warmup_iters=3, iters=1,
                           seed=0, command_line=[], started_at="", finished_at="")
    window = WindowTotals(wall_time_ns=start, kernel_count=16, kernel_time_ns=32_000, unprofiled_wall_time_ns=start,
                          unprofiled_gpu_busy_time_ns=32_000, unprofiled_windows=5)
    return OperatorAttributedProfile(capture_metadata=meta, window=window, operators=operators, runtime_events=events)


def test_a_routing_window_gets_no_cuda_graph_advice_without_static_shapes_first(tmp_path):
    analysis = analyze_profile(_moe_window(), tmp_path, measure=False)
    (point,) = analysis.syncs or []
    assert (point.call_site, point.count, point.idle_after_ns, point.data_dependent) == ("/w/moe.py:41", 8, 400_000,
                                                                                          True)
    advice = [o for o in analysis.opportunities if o.change_class in ("cuda_graphs", "inductor_config")]
    assert advice, "a host-bound window of tiny kernels still gets the advice, with what must come first"
    for opportunity in advice:
        assert "— first make the shapes static (aten::nonzero at moe.py:41)" in opportunity.title
        assert any("capture_dynamic_output_shape_ops" in need for need in opportunity.prerequisites)
        # nonzero's own wait is part of its data-dependent shape: not listed again as a synchronisation to remove
        assert not any(need.startswith("remove the host synchronisation") for need in opportunity.prerequisites)
    removal = next(o for o in analysis.opportunities if o.change_class == "host_syncs")
    assert removal.estimated_saving_ns == 400_000 and "moe.py:41: cudaStreamSynchronize x8" in removal.triggers[0]
