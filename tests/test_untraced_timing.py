"""A script that ends before the timing pass traces a window: the windows it timed without the profiler still
set the window, its idle time and what the synchronisations cost.

`h200_llama_static_decode.profile.json.xz`: scripts/gpu_workloads/llama_static_decode.py as it is (`--script
--window-fn generate --steps 1:1`, three generate() calls of Hugging Face's Llama over a static KV cache), recorded by
`scripts/record_real_workloads.py --cases llama_static_decode` on an H200 on 2026-11-30. The script ran three
calls: one warmed up, two were timed without the profiler, and none was left for the kernel trace. The analysis
used to fall back to the profiled window (441 ms, GPU busy 4.2 %) and to the idle time under the profiler after
each synchronisation (159 ms of it, 176 % of the timed window), where four `cudaDeviceSynchronize` calls before one
kernel each counted the same 34.8 ms gap. Expected values are recomputed here from the profile's own fields.
"""

from __future__ import annotations

import lzma
import statistics
from pathlib import Path

from fixtures_util import FIXTURES, interval_union

from mcp_server.analysis import analyze_profile
from mcp_server.schema.io import load_profile
from mcp_server.schema.profile import OperatorAttributedProfile


def _profile(tmp_path: Path) -> OperatorAttributedProfile:
    path = tmp_path / "profile.json"
    path.write_bytes(lzma.decompress((FIXTURES / "h200_llama_static_decode.profile.json.xz").read_bytes()))
    return load_profile(path)


def test_a_window_timed_but_not_traced_sets_the_window_and_its_idle_time(tmp_path: Path) -> None:
    profile = _profile(tmp_path)
    window = profile.window
    assert window.unprofiled_windows == 2 and window.unprofiled_gpu_busy_time_ns is None
    assert window.unprofiled_wall_time_range_ns is not None
    timed = int(statistics.median(window.unprofiled_wall_time_range_ns))
    kernels = [k for op in profile.operators for k in op.kernels] + profile.unattributed_kernels
    busy = interval_union([(k.start_ns, k.start_ns + k.duration_ns) for k in kernels])
    analysis = analyze_profile(profile, out_dir=tmp_path / "analysis", measure=False)
    timeline = analysis.timeline
    assert timeline is not None and timeline.unprofiled
    assert timeline.window_ns == timed  # 90.4 ms, not the profiled 441 ms
    assert "median of 2 windows" in timeline.window_source and "no window traced" in timeline.window_source
    assert abs(timeline.gpu_busy_ns - busy) <= len(kernels)  # the profiled kernels' busy time stands
    assert timeline.idle_ns == timed - timeline.gpu_busy_ns
    assert abs(sum(timeline.idle_by_cause_ns.values()) - timeline.idle_ns) <= len(kernels)


def test_the_idle_after_each_synchronisation_is_scaled_to_the_timed_window(tmp_path: Path) -> None:
    profile = _profile(tmp_path)
    analysis = analyze_profile(profile, out_dir=tmp_path / "analysis", measure=False)
    window = profile.window
    profiled_window = max(window.gpu_elapsed_ns or 0, max(k.start_ns + k.duration_ns for op in profile.operators
                                                             for k in op.kernels))
    factor = (window.unprofiled_wall_time_ns - window.gpu_busy_time_ns) / (profiled_window - window.gpu_busy_time_ns)
    assert 0 < factor < 0.25  # the profiler made this window's idle time more than four times longer
    events = {e.event_id: e for e in profile.runtime_events or []}
    owner: dict[int, int] = {}  # next kernel -> the first synchronising call of the workload before it
    for event in sorted(events.values(), key=lambda e: e.start_ns):
        if event.origin == "workload" and event.synchronizing and event.next_kernel_id is not None:
            owner.setdefault(event.next_kernel_id, event.event_id)
    waiting = [p for p in analysis.syncs or [] if p.synchronizing and p.idle_after_ns is not None]
    assert waiting and {p.idle_source for p in waiting} == {"scaled"}
    for point in waiting:
        profiled = sum(events[i].idle_after_ns or 0 for i in point.event_ids if events[i].synchronizing
                       and owner.get(events[i].next_kernel_id or -1, i) == i)
        assert abs(point.idle_after_ns - profiled * factor) <= point.count
    device = next(p for p in waiting if p.api == "cudaDeviceSynchronize")
    shared = [events[i] for i in device.event_ids if owner.get(events[i].next_kernel_id or -1) != i]
    assert len(shared) == 3, "three of the five device-wide synchronisations wait before a kernel another one did"
    total = sum(p.idle_after_ns or 0 for p in waiting)
    assert total <= window.unprofiled_wall_time_ns - window.gpu_busy_time_ns
    syncs = next(o for o in analysis.opportunities if o.change_class == "host_syncs")
    assert syncs.estimated_saving_pct < 100 and "scaled to the idle time of the window" in syncs.estimate_label
