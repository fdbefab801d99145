"""The host's own compute: operators that launched no kernel and made no CUDA call (operators on CPU tensors), which
the profile records by operator, module and call site (`window.host_operators`). Where they fill much of the
window's idle time, the window waits on the host computing, not on launches: no change to launches recovers that
time, and the change is to move the work or overlap it."""

from __future__ import annotations

from mcp_server.analysis.rules import rule
from mcp_server.schema.analysis import Finding, TimelineHealth
from mcp_server.schema.profile import HostOperatorTime, OperatorAttributedProfile


def launch_idle(health: TimelineHealth) -> int:
    """The idle time a change to launches (fewer, cheaper, captured, without synchronisations) may recover: all of
    it but the host's own compute (operators that launch nothing), which goes on whatever the launches cost."""
    return max(0, health.idle_ns - health.host_compute_ns)


def host_compute_left(health: TimelineHealth) -> str:
    """The estimate's words for the host compute it leaves out, when there is any."""
    if not health.host_compute_ns:
        return ""
    return (f"; at most the {launch_idle(health) / 1e6:.3f} ms of idle time the host's own compute leaves "
            f"({health.host_compute_ns / 1e6:.3f} ms in operators that launch nothing, under the profiler)")


def _place(op: HostOperatorTime) -> str:
    site = op.call_site.rsplit("/", 1)[-1] if op.call_site else None
    where = ", ".join(w for w in (op.module_path, site) if w)
    return f"{op.operator_name}" + (f" ({where})" if where else "")


def host_compute_places(profile: OperatorAttributedProfile, most: int = 3) -> str:
    """The largest host operators, `aten::sqrt (Embedding, train.py:58) 56.6 ms; ...`."""
    return "; ".join(f"{_place(op)} {op.host_time_ns / 1e6:.1f} ms" for op in (profile.window.host_operators or [])[
        :most])


def host_compute_finding(profile: OperatorAttributedProfile, health: TimelineHealth) -> Finding | None:
    """The host's own compute as a finding, when it takes at least `timeline.host_compute_pct` of the window."""
    host = health.host_compute_ns
    if not host or 100.0 * host < rule("timeline", "host_compute_pct") * max(health.window_ns, 1):
        return None
    return Finding(
        kind="host_compute", title=f"The host computes {host / 1e6:.1f} ms of the window's idle time itself",
        module_paths=list(dict.fromkeys(op.module_path for op in profile.window.host_operators or []
                                        if op.module_path)),
        triggers=[f"host_compute_ns={host}", f"idle_ns={health.idle_ns}"],
        detail=f"Operators that launch no kernel and make no CUDA call (on CPU tensors, or a tensor subclass's Python "
               f"dispatch: a nested tensor's views) run {host / 1e6:.1f} ms "
               f"under the profiler while the GPU waits: {host_compute_places(profile)}. Cheaper launches do not "
               "shorten that time; moving the work to the GPU, or overlapping it with the GPU's, does.")
