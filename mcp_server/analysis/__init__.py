"""Analysis: roofline, bottleneck classes, warp stalls, timeline health, ranked opportunities, pictures.

    from mcp_server.analysis import analyze_profile, format_summary
    analysis = analyze_profile(load_profile(path), out_dir)
    print(format_summary(analysis))
"""

from mcp_server.analysis.analyze import analyze_profile
from mcp_server.analysis.devices import match_device, measure_peaks
from mcp_server.analysis.diagnosis import format_summary

__all__ = ["analyze_profile", "format_summary", "match_device", "measure_peaks"]
