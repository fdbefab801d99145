"""Which throughput metrics cost ncu's replay passes, and what the inputs of their breakdowns read instead.

The five `*_throughput` percentages of `plugins/ncu/metrics.yaml` are ncu breakdown metrics: the max of many
inputs, which take several replay passes. This probe, on a GPU machine:

1. `membership`: each throughput's breakdown inputs (what `breakdown:<metric>` alone records);
2. `values`: one window of varied kernels (a torchvision ResNet-50, a transformer encoder layer in fp32 and under
   bf16 autocast, an LSTM, an Inductor-compiled function, fp16/fp64 matmuls, flash attention, channels-last bf16
   convolution, atomics, element-wise and reduction kernels) replayed once per launch configuration with the five
   and their breakdowns: each kernel's values as JSON, and how far the largest of metrics.yaml's `busiest_of`
   inputs reads below each throughput;
3. `passes`: whole metric sets (metrics.yaml as it stands, with the four throughputs themselves instead, without
   them, without them and each other group) timed as `ncu_pass_cost.py` times them: passes per kernel and
   seconds per replayed kernel.

    python3 benchmarks/ncu_throughput_probe.py --out probe/                  # GPU machine
    python3 benchmarks/ncu_throughput_probe.py --compare probe/values.json   # anywhere
    python3 benchmarks/ncu_throughput_probe.py --fixture probe/ tests/fixtures/h100_ncu_throughput_breakdowns.json.xz

`--fixture` keeps, per kernel, the five throughputs and every input of their breakdowns at the throughput's own
roll-up (what tests/test_ncu_busiest_of.py replays).
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from mcp_server.process.child import run_child  # noqa: E402
from mcp_server.schema.io import write_json_atomic  # noqa: E402
from plugins.ncu.command import collected_metrics, default_metrics, find_ncu, metric_inputs, replayed_passes  # noqa: E402
from plugins.ncu.reader import metric_value  # noqa: E402

TIMEOUT_S = 600.0
STANDARD = {
    "sm_throughput_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "memory_throughput_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_throughput_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "l1_throughput_pct": "l1tex__throughput.avg.pct_of_peak_sustained_active",
    "l2_throughput_pct": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
}
WINDOW = """
import sys, time, torch, torchvision
torch.manual_seed(0)
dev = "cuda"
resnet = torchvision.models.resnet50().to(dev).eval()
layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True).to(dev).eval()
lstm = torch.nn.LSTM(256, 512, num_layers=2, batch_first=True).to(dev).eval()
emb = torch.nn.Embedding(50257, 768).to(dev)
img = torch.randn(16, 3, 224, 224, device=dev)
seq = torch.randn(8, 128, 768, device=dev)
ids = torch.randint(0, 50257, (8, 128), device=dev)
series = torch.randn(16, 64, 256, device=dev)
big = torch.randn(4096, 4096, device=dev)
w = torch.randn(1024, 1024, device=dev)
compiled = torch.compile(lambda x: torch.nn.functional.layer_norm(torch.nn.functional.gelu(x @ w), (1024,)) * 2)
half, dbl = big[:2048, :2048].half(), big[:1024, :1024].double()
q = torch.randn(8, 12, 1024, 64, device=dev, dtype=torch.bfloat16)
conv_cl = torch.nn.Conv2d(64, 128, 3, padding=1).to(dev).to(memory_format=torch.channels_last)
img_cl = torch.randn(32, 64, 56, 56, device=dev).to(memory_format=torch.channels_last)
acc = torch.zeros(4096, device=dev)
idx = torch.randint(0, 4096, (1 << 20,), device=dev)
def step():
    with torch.no_grad():
        resnet(img); layer(seq); lstm(series); emb(ids); compiled(big[:, :1024])
        with torch.autocast("cuda", dtype=torch.bfloat16):
            layer(seq); big @ big; conv_cl(img_cl)
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        half @ half; dbl @ dbl; torch.special.erf(big).exp_(); acc.index_add_(0, idx, big.view(-1)[: 1 << 20])
        torch.softmax(big, -1); big.sum(0); big.t().contiguous(); torch.sort(big[:64], -1)
for _ in range(2):
    step()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
t0 = time.perf_counter()
step()
torch.cuda.synchronize()
print("WINDOW_S", time.perf_counter() - t0, flush=True)
torch.cuda.cudart().cudaProfilerStop()
"""


NOT_COUNTERS = ("launch__", "device__", "profiler__", "numa__", "nvlink__", "c2clink__", "gpu__time_duration",
                "sm__maximum_warps", "smsp__maximum_warps")


def membership(ncu: str, work: Path) -> dict[str, list[str]]:
    """Each standard throughput's breakdown inputs on this GPU: the metrics `breakdown:<metric>` alone records."""
    from ncu_pass_cost import CHILD

    child = work / "small.py"
    child.write_text(CHILD, encoding="utf-8")
    out: dict[str, list[str]] = {}
    for key, metric in STANDARD.items():
        report = work / f"breakdown_{key}"
        cmd = [ncu, "--profile-from-start", "off", "--replay-mode", "kernel", "--launch-count", "1",
               "--metrics", f"breakdown:{metric}", "--export", str(report), "--force-overwrite",
               sys.executable, str(child), "1"]
        code, timed_out = run_child(cmd, work / f"breakdown_{key}.log", TIMEOUT_S)
        if code != 0 or timed_out:
            out[key] = [f"error: exit {code}"]
            continue
        rows = read_all(report.with_suffix(".ncu-rep"))
        out[key] = sorted(n for n in rows[0]["values"] if not n.startswith(NOT_COUNTERS) and n != metric)
        print(key, len(out[key]), "inputs", flush=True)
    return out


def pass_variants() -> dict[str, list[str]]:
    """name -> metrics: whole metric sets, each timed on ncu_pass_cost's small window."""
    every = default_metrics()
    thr = set(STANDARD) - {"dram_throughput_pct"}
    rest = {k: m for k, m in every.items() if k not in thr}
    groups = {
        "stalls": [k for k in rest if k.startswith("stall_")],
        "flop_tensor": [k for k in rest if k.startswith("flop_tensor_")],
        "sass": [k for k in rest if k.startswith("inst_") and k != "inst_executed"],
        "hit_rates": [k for k in rest if "hit_rate" in k],
        "tensor_pipes": [k for k in rest if k.startswith("tensor_")],
        "occupancy_issue": ["achieved_occupancy_pct", "issue_active_pct"],
    }
    table: dict[str, list[str]] = {
        "exact_throughputs": list(every.values()),  # the set before metrics.yaml's busiest_of
        "busiest_of": collected_metrics("H100"),  # metrics.yaml as it stands, where busiest_of applies
        "without_four_throughputs": list(rest.values()),
    }
    for name, keys in groups.items():
        table[f"without_four_throughputs_and_{name}"] = [m for k, m in rest.items() if k not in keys]
    return table


def capture_values(ncu: str, work: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """One replay per launch configuration of the varied window, with the five, their breakdowns and inputs."""
    child = work / "window.py"
    child.write_text(WINDOW, encoding="utf-8")
    metrics = ["gpu__time_duration.sum", *STANDARD.values(), *(f"breakdown:{m}" for m in STANDARD.values())]
    metrics += sorted({m for group in metric_inputs().values() for m in group})
    report = work / "values"
    cmd = [ncu, "--profile-from-start", "off", "--replay-mode", "kernel", "--cache-control", "all",
           "--clock-control", "base", "--filter-mode", "per-launch-config", "--launch-count", "1",
           "--metrics", ",".join(metrics), "--export", str(report), "--force-overwrite", sys.executable, str(child)]
    code, timed_out = run_child(cmd, work / "values.log", TIMEOUT_S)
    log = (work / "values.log").read_text(encoding="utf-8", errors="replace").splitlines()
    if code != 0 or timed_out:
        raise SystemExit("value capture failed:\n" + "\n".join(log[-20:]))
    passes = sorted({n for line in log if (n := replayed_passes(line)) is not None})
    print(f"value capture: {sum(1 for line in log if replayed_passes(line) is not None)} kernels, passes {passes}",
          flush=True)
    return read_all(report.with_suffix(".ncu-rep")), log[-5:]


def read_all(path: Path) -> list[dict[str, Any]]:
    """Every numeric metric of every profiled kernel (this process loads ncu_report; it never imports torch)."""
    import ncu_report

    report = ncu_report.load_report(str(path))
    rows: list[dict[str, Any]] = []
    for r in range(report.num_ranges()):
        rng = report.range_by_idx(r)
        for a in range(rng.num_actions()):
            action = rng.action_by_idx(a)
            values: dict[str, float] = {}
            for name in action.metric_names():
                if (value := metric_value(action.metric_by_name(name), ncu_report)) is not None:
                    values[name] = value
            rows.append({"name": action.name(), "values": values})
    return rows


def compare(path: Path) -> None:
    """Per throughput with metrics.yaml inputs: how far below it the largest of those inputs reads, per kernel."""
    rows = json.loads(path.read_text(encoding="utf-8"))["kernels"]
    print(f"{len(rows)} kernels")
    for key, names in metric_inputs().items():
        metric = STANDARD[key]
        gaps = sorted(r["values"][metric] - max(r["values"].get(n, 0.0) for n in names)
                      for r in rows if metric in r["values"])
        if not gaps:
            print(f"{key}: no kernel has {metric}")
            continue
        equal = sum(g < 0.01 for g in gaps)
        print(f"{key}: {equal} of {len(gaps)} kernels equal; largest gaps {[round(g, 2) for g in gaps[-3:]]} points")


def write_fixture(folder: Path, out: Path) -> None:
    """The probe's membership and values, cut to the five throughputs and their breakdowns' inputs, as .json.xz."""
    members = json.loads((folder / "membership.json").read_text(encoding="utf-8"))
    rows = json.loads((folder / "values.json").read_text(encoding="utf-8"))["kernels"]
    inputs = {key: [n for n in members[key] if n.endswith(metric.split(".", 1)[1])] for key, metric in STANDARD.items()}
    keep = set(STANDARD.values()) | {n for names in inputs.values() for n in names}
    data = {"throughputs": STANDARD, "breakdown_inputs": inputs,
            "kernels": [{"name": r["name"], "values": {n: v for n, v in r["values"].items() if n in keep}}
                        for r in rows]}
    out.write_bytes(lzma.compress(json.dumps(data, sort_keys=True).encode("utf-8")))
    print(f"{out}: {len(rows)} kernels, {len(keep)} metrics, {out.stat().st_size / 1024:.0f} KiB")


def main() -> int:
    """Membership, values, passes on a GPU machine; or compare a values.json anywhere."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for membership.json, values.json and passes.json")
    parser.add_argument("--compare", type=Path, help="a values.json to summarise (no GPU needed)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["membership", "values", "passes"])
    parser.add_argument("--fixture", nargs=2, type=Path, metavar=("PROBE_DIR", "OUT"),
                        help="write the test fixture from a probe folder's membership.json and values.json")
    args = parser.parse_args()
    if args.fixture:
        write_fixture(*args.fixture)
        return 0
    if args.compare:
        compare(args.compare)
        return 0
    if args.out is None:
        parser.error("--out or --compare is required")
    ncu = find_ncu()
    if ncu is None:
        print("ncu not found: set $NCU or install Nsight Compute", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        if "membership" not in args.skip:
            write_json_atomic(args.out / "membership.json", membership(ncu, Path(tmp)))
        if "values" not in args.skip:
            rows, tail = capture_values(ncu, Path(tmp))
            write_json_atomic(args.out / "values.json", {"kernels": rows, "log_tail": tail})
            compare(args.out / "values.json")
        if "passes" not in args.skip:
            from ncu_pass_cost import CHILD, measure

            base = ["--cache-control", "all", "--clock-control", "base"]
            results: dict[str, object] = {}
            child = Path(tmp) / "window_small.py"
            child.write_text(CHILD, encoding="utf-8")
            for name, metrics in pass_variants().items():
                results[name] = measure(ncu, child, 3, base, metrics)
                print(name, json.dumps(results[name]), flush=True)
            write_json_atomic(args.out / "passes.json", results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
