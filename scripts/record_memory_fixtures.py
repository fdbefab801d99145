"""Record the memory pass on a GPU machine for the CPU tests (tests/fixtures/h100_memory_*) and measure its targets.

One command, torch with CUDA, no network:

    python scripts/record_memory_fixtures.py --out "$OUT"        # --gpu h100 (default) names the files

For each workload of scripts/gpu_workloads/ it runs the product's own CLI, `operator-profiler memory WORKLOAD
--output RUN_DIR` (a child process, as a user would), and packs the run directory as `<out>/<gpu>_memory_<name>.tar.xz`:

- `transformer_train`: memory_transformer.py (a 111 M-parameter decoder, one AdamW step, `--train-step`); the same
  window is also run without any profiler in a child of its own, which reports `torch.cuda.max_memory_allocated()`
  (the 1 % target) and the window's time (the memory pass's cost);
- `oom`: memory_oom.py (activations beyond 80 GiB, `--train-step`): the CLI must exit 1 with the out-of-memory
  screen, the run directory keeping the snapshot up to the failure;
- `cnn_eager`: memory_cnn.py (a small CNN's eager forward).

`<out>/<gpu>_memory_measurements.json` keeps the numbers; a short table is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mcp_server.schema.io import read_model  # noqa: E402
from mcp_server.schema.memory import MemoryProfile  # noqa: E402

WORKLOADS = REPO / "scripts" / "gpu_workloads"
RUNS: dict[str, tuple[str, list[str]]] = {
    "transformer_train": ("memory_transformer.py", ["--train-step"]),
    "oom": ("memory_oom.py", ["--train-step"]),
    "cnn_eager": ("memory_cnn.py", []),
}
GIB = 1024 ** 3
# The memory pass's window, run without any profiler: the harness's seeding, one warm-up iteration (the memory
# pass warms up one), the allocator's peak reset, one iteration, synchronised.
REFERENCE = """
import json, sys, time
sys.path.insert(0, {repo!r})
import torch
from mcp_server.children.common import as_call, load_workload, seed_all
seed_all(0)
module = load_workload(__import__("pathlib").Path({workload!r}))
model, inputs = module.get_model_and_input()
args, kwargs = as_call(inputs)
def step():
    if {train!r}:
        module.train_step(model, inputs)
    else:
        with torch.no_grad():
            model(*args, **kwargs)
step()
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats()
t0 = time.perf_counter()
step()
torch.cuda.synchronize()
print(json.dumps({{"max_memory_allocated": torch.cuda.max_memory_allocated(),
                  "max_memory_reserved": torch.cuda.max_memory_reserved(),
                  "window_s": time.perf_counter() - t0}}))
"""


def capture(name: str, root: Path) -> dict[str, Any]:
    """`operator-profiler memory` on one workload into root/<name>; its exit code, wall time and output."""
    workload, flags = RUNS[name]
    run_dir = root / name
    command = [sys.executable, "-m", "mcp_server.cli", "memory", str(WORKLOADS / workload), "--output",
               str(run_dir), *flags]
    t0 = time.monotonic()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1200)
    found = {"command": command[2:], "exit_code": done.returncode, "wall_s": round(time.monotonic() - t0, 1),
             "stdout": done.stdout, "stderr": done.stderr}
    print(f"== {name}: exit {done.returncode} in {found['wall_s']} s", flush=True)
    print(done.stdout[-3000:], done.stderr[-3000:], sep="\n", flush=True)
    return found


def reference(name: str) -> dict[str, Any]:
    """The window run without any profiler, in a child of its own."""
    workload, flags = RUNS[name]
    code = REFERENCE.format(repo=str(REPO), workload=str(WORKLOADS / workload), train="--train-step" in flags)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def facts(run_dir: Path) -> dict[str, Any]:
    """What the run's memory.json and its memory pass say."""
    path = run_dir / "memory.json"
    if not path.is_file():
        return {"memory_json": False}
    profile = read_model(path, MemoryProfile, "memory.json", "")
    moment = profile.oom.held if profile.oom is not None and profile.oom.held is not None else profile.at_peak
    manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    harness = json.loads((run_dir / "memory" / "harness.json").read_text(encoding="utf-8"))
    record = json.loads((run_dir / "memory" / "memory_record.json").read_text(encoding="utf-8"))
    return {
        "memory_json": True, "peak_allocated_bytes": profile.peak_allocated_bytes,
        "peak_reserved_bytes": profile.peak_reserved_bytes, "peak_requested_bytes": profile.peak_requested_bytes,
        "replayed_peak_bytes": profile.replayed_peak_bytes, "attributed_pct": moment.attributed_pct if moment else None,
        "by_category": {str(g.key): g.bytes for g in (moment.by_category if moment else [])},
        "holders": [h.model_dump() for h in (moment.holders[:5] if moment else [])],
        "findings": [(f.pattern, f.saving_bytes) for f in profile.findings], "trace_entries": profile.trace_entries,
        "unmatched_frees": profile.unmatched_frees, "clock_offset_us": profile.clock_offset_us,
        "oom": profile.oom.model_dump(exclude={"held"}) if profile.oom is not None else None,
        "memory_pass_wall_s": next((p["wall_time_s"] for p in manifest["passes"] if p["name"] == "memory"), None),
        "window_wall_ns": (harness.get("window") or {}).get("wall_time_ns"),
        "snapshot_s": [record.get("start_snapshot_s"), record.get("end_snapshot_s")],
        "ops_recorded": len(record.get("ops", [])),
        "files": {p.name: p.stat().st_size for p in (run_dir / "memory").iterdir() if p.is_file()},
    }


def pack(run_dir: Path, out: Path, gpu: str) -> Path:
    """`<out>/<gpu>_memory_<name>.tar.xz` holding the run directory as `<name>/`."""
    archive = out / f"{gpu}_memory_{run_dir.name}.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(run_dir, arcname=run_dir.name)
    return archive


def _gib(n: int | None) -> str:
    return f"{n / GIB:.3f} GiB" if n is not None else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the archives and measurements")
    parser.add_argument("--gpu", default="h100", help="prefix of the files (default h100)")
    parser.add_argument("--runs", nargs="*", default=list(RUNS), choices=list(RUNS))
    args = parser.parse_args()
    out = args.out.resolve()
    root = out / "runs"
    root.mkdir(parents=True, exist_ok=True)
    os.environ.pop("OPERATOR_PROFILER_EXAMPLE_SCALE", None)
    results: dict[str, Any] = {}
    for name in args.runs:
        found = capture(name, root)
        found.update(facts(root / name))
        if name == "transformer_train":
            found["reference"] = reference(name)
        found["archive"] = pack(root / name, out, args.gpu).name if (root / name).is_dir() else None
        results[name] = found
    (out / f"{args.gpu}_memory_measurements.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print("\nrun                exit  peak (memory pass)  max_memory_allocated (no profiler)  diff    attributed  "
          "memory pass  window: memory pass / no profiler")
    for name, r in results.items():
        ref = r.get("reference", {}).get("max_memory_allocated")
        peak = r.get("peak_allocated_bytes")
        diff = f"{100 * (peak - ref) / ref:+.2f} %" if peak and ref else "-"
        window = r.get("window_wall_ns")
        ref_window = r.get("reference", {}).get("window_s")
        times = f"{window / 1e6:.1f} ms / {ref_window * 1e3:.1f} ms" if window and ref_window else "-"
        print(f"{name:18s} {r['exit_code']:4d}  {_gib(peak):>18s}  {_gib(ref):>34s}  {diff:>6s}  "
              f"{r.get('attributed_pct') or 0:8.2f} %  {r.get('memory_pass_wall_s') or 0:9.1f} s  {times}")
    oom = results.get("oom")
    if oom is not None:
        print("\nout-of-memory screen (stderr of `operator-profiler memory memory_oom.py --train-step`):")
        print("\n".join(oom["stderr"].strip().splitlines()[-24:]))
    print(f"\narchives and {args.gpu}_memory_measurements.json in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
