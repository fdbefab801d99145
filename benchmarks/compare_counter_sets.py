"""Two profiles of one workload captured with different ncu metric sets: counters and kernel classes, side by side.

Joins the window's kernels in launch order (the same deterministic workload launches the same kernels; a
differing name stops the join) and prints, per counter key asked for, how far the second profile's values read
from the first's, and how many kernels `analyze` puts in another bottleneck class (from counters alone: the
launch-overhead rule, which reads the run's own idle gaps, is left out). No GPU needed:

    python3 benchmarks/compare_counter_sets.py OLD/profile.json NEW/profile.json [--keys sm_throughput_pct,...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mcp_server.analysis.classify import classify_kernel  # noqa: E402
from mcp_server.schema.io import load_profile  # noqa: E402
from mcp_server.schema.profile import KernelRecord, OperatorAttributedProfile  # noqa: E402

KEYS = "sm_throughput_pct,memory_throughput_pct,l1_throughput_pct,l2_throughput_pct,dram_throughput_pct"


def kernels(profile: OperatorAttributedProfile) -> list[KernelRecord]:
    """The window's kernels with counters, in launch order."""
    every = [k for op in profile.operators for k in op.kernels] + list(profile.unattributed_kernels)
    return sorted((k for k in every if k.metrics), key=lambda k: k.start_ns)


def compare(old: OperatorAttributedProfile, new: OperatorAttributedProfile, keys: list[str]) -> dict[str, object]:
    """Per key: n, median and largest |new - old| in points, and how often new reads lower; class changes."""
    a, b = kernels(old), kernels(new)
    if [k.kernel_name for k in a] != [k.kernel_name for k in b]:
        raise SystemExit(f"the profiles launched other kernels ({len(a)} and {len(b)} with counters)")
    out: dict[str, object] = {"kernels": len(a)}
    for key in keys:
        diffs = sorted(b_k.metrics[key].value - a_k.metrics[key].value for a_k, b_k in zip(a, b, strict=True)
                       if key in a_k.metrics and key in b_k.metrics)
        if diffs:
            absolute = sorted(abs(d) for d in diffs)
            out[key] = {"n": len(diffs), "median_abs_diff": round(absolute[len(absolute) // 2], 2),
                        "max_abs_diff": round(absolute[-1], 2), "new_lower_by_over_1": sum(d < -1 for d in diffs),
                        "new_higher_by_over_1": sum(d > 1 for d in diffs)}
    changed = [(k_a.kernel_name[:60], c_a.value, c_b.value) for k_a, k_b in zip(a, b, strict=True)
               if (c_a := classify_kernel(k_a, None)[0]) != (c_b := classify_kernel(k_b, None)[0])]
    out["class_changed"] = len(changed)
    out["class_changes"] = changed[:20]
    return out


def main() -> int:
    """Print the comparison as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--keys", default=KEYS, help=f"counter keys to compare (default {KEYS})")
    args = parser.parse_args()
    print(json.dumps(compare(load_profile(args.old), load_profile(args.new), args.keys.split(",")), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
