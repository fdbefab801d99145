"""Calibrate the analysis's estimates: apply each top opportunity alone, bench it, and put the measured change
beside the estimate.

    python benchmarks/calibrate_estimates.py --out "$OUT" [--work /tmp/op_targets] [--workloads conv_block,gpt2]

For each workload (an example's name or a .py path), the eager run directory `WORK/<name>_eager` is reused when
it holds a profile.json (`benchmarks/benchmark_targets.py` writes them), else `operator-profiler run` makes it.
`analyze` ranks the opportunities; each one whose change class has a recipe below is applied alone, as an
optimized workload whose `optimize(model)` does exactly that change, and `operator-profiler bench` times it against
the eager baseline (CUDA events, interleaved, the baseline's weights). The estimated speedup is the unprofiled
window over the window less the estimated saving. Writes calibration.json and prints the table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mcp_server.analysis import analyze_profile  # noqa: E402
from mcp_server.schema.io import load_profile  # noqa: E402

ALL = "conv_block,gpt2,embedding_projection,mlp_activations,sdpa_attention,depthwise_separable_conv," \
      "lstm_sequence_encoder"
TOP = 3

# change class -> (what the optimized workload does, the body of its optimize(model))
RECIPES: dict[str, tuple[str, str]] = {
    "cuda_graphs": ("the eager forward captured once in a CUDA graph and replayed (inputs copied in), no Inductor",
                    "return _Graphed(model)"),
    "inductor_config": ("torch.compile(model): Inductor's fusion (and its other choices)",
                        "return torch.compile(model)"),
    "dtype_autocast": ("TF32 tensor cores for FP32 matmuls and convolutions, set around each call",
                       "return _Tf32(model)"),
    "conv_bn_fold": ("the FX pass knowledge/fx_patterns/conv_bn_fold.py in a Dynamo graph, no Inductor",
                     "return torch.compile(model, backend=_fx_backend('conv_bn_fold', 'fold_conv_bn'))"),
    "sdpa_substitution": ("the FX pass knowledge/fx_patterns/sdpa_substitution.py in a Dynamo graph, no Inductor",
                          "return torch.compile(model, backend=_fx_backend('sdpa_substitution', 'substitute_sdpa'))"),
    "qkv_fusion": ("the FX pass knowledge/fx_patterns/qkv_fusion.py in a Dynamo graph, no Inductor",
                   "return torch.compile(model, backend=_fx_backend('qkv_fusion', 'fuse_parallel_linears'))"),
}

WRAPPER = '''"""{what}: {baseline}, with one change applied for calibration."""

import importlib.util
import sys

import torch

_spec = importlib.util.spec_from_file_location("calibrated_baseline", {baseline!r})
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)
sys.path.insert(0, {patterns!r})


def get_model_and_input():
    return _base.get_model_and_input()


class _Tf32(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args):
        saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        try:
            return self.inner(*args)
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


class _Graphed(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.graph = inner, None

    def forward(self, *args):
        if self.graph is None:
            self.static = [a.clone() if torch.is_tensor(a) else a for a in args]
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    self.inner(*self.static)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.out = self.inner(*self.static)
        for static, given in zip(self.static, args):
            if torch.is_tensor(static):
                static.copy_(given)
        self.graph.replay()
        return self.out


def _fx_backend(module, function):
    apply = getattr(importlib.import_module(module), function)

    def backend(gm, example_inputs):
        with open({applied!r}, "a") as log:
            log.write(f"{{function}} {{apply(gm)}}\\n")
        gm.recompile()
        return gm.forward

    return backend


def optimize(model):
    {body}
'''


def _workload(entry: str) -> Path:
    return REPO / entry if entry.endswith(".py") else REPO / "examples" / entry / f"{entry}.py"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mcp_server.cli", *args], capture_output=True, text=True,
                          check=False)


def calibrate(entry: str, work: Path) -> list[dict[str, object]]:
    """The rows of one workload: each top opportunity with a recipe, estimated and measured."""
    path = _workload(entry)
    run_dir = work / f"{path.stem}_eager"
    if not (run_dir / "profile.json").is_file():
        proc = _cli("run", str(path), "--compile-mode", "eager", "-o", str(run_dir), "-q")
        if proc.returncode != 0:
            return [{"workload": path.stem, "error": proc.stderr.strip().splitlines()[-1:]}]
    profile = load_profile(run_dir / "profile.json")
    analysis = analyze_profile(profile, run_dir / "analysis")
    timeline = analysis.timeline
    assert timeline is not None
    rows: list[dict[str, object]] = []
    for opportunity in analysis.opportunities[:TOP]:
        row: dict[str, object] = {
            "workload": path.stem, "rank": opportunity.rank, "opportunity": opportunity.title,
            "change_class": opportunity.change_class, "window_ns": timeline.window_ns,
            "window_source": timeline.window_source, "estimated_saving_ns": opportunity.estimated_saving_ns,
            "estimated_speedup": round(timeline.window_ns / max(timeline.window_ns - opportunity.estimated_saving_ns,
                                                                1), 3),
            "verdict": analysis.diagnosis.bottleneck.value,
        }
        rows.append(row)
        recipe = RECIPES.get(opportunity.change_class)
        if recipe is None:
            row["measured"] = "no recipe applies this change alone"
            continue
        what, body = recipe
        optimized = work / "calibration" / f"{path.stem}_{opportunity.rank}_{opportunity.change_class}.py"
        optimized.parent.mkdir(parents=True, exist_ok=True)
        applied = optimized.with_suffix(".applied")
        applied.unlink(missing_ok=True)
        optimized.write_text(WRAPPER.format(what=what, baseline=str(path), body=body, applied=str(applied),
                                            patterns=str(REPO / "knowledge" / "fx_patterns")))
        out = optimized.with_suffix("")
        proc = _cli("bench", str(path), str(optimized), "-o", str(out), "-q", "--timeout", "300")
        row["recipe"] = what
        if proc.returncode != 0 or not (out / "bench.json").is_file():
            row["measured"] = "bench failed: " + " ".join(proc.stderr.strip().splitlines()[-1:])
            continue
        if applied.is_file():  # per compiled graph: the pass and how many rewrites it made
            row["rewrites"] = sum(int(line.split()[1]) for line in applied.read_text().splitlines())
        bench = json.loads((out / "bench.json").read_text())
        speedup = bench["speedup"]
        base_ns, opt_ns = bench["baseline"]["summary"]["median_ns"], bench["optimized"]["summary"]["median_ns"]
        row.update(measured_speedup=round(speedup["point"], 3),
                   measured_ci=[round(speedup["ci_low"], 3), round(speedup["ci_high"], 3)],
                   baseline_median_ns=base_ns, optimized_median_ns=opt_ns,
                   measured_saving_ns=int(base_ns - opt_ns), baseline="eager (bench, CUDA events)")
    return rows


def table(rows: list[dict[str, object]]) -> str:
    """A markdown table of the rows."""
    lines = ["| workload | # | opportunity (class) | window, no profiler | estimated saving (speedup) | applied as | "
             "measured saving (speedup, 95 % CI) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['workload']} | – | run failed: {r['error']} | | | | |")
            continue
        measured = r.get("measured") or (
            f"{int(r['measured_saving_ns']) / 1e6:.3f} ms ({r['measured_speedup']}×, "  # type: ignore[call-overload]
            f"{r['measured_ci'][0]}–{r['measured_ci'][1]})"  # type: ignore[index]
            + (f"; {r['rewrites']} rewrites" if "rewrites" in r else ""))
        lines.append(
            f"| {r['workload']} | {r['rank']} | {r['opportunity']} ({r['change_class']}) | "
            f"{int(r['window_ns']) / 1e6:.3f} ms | ≤ {int(r['estimated_saving_ns']) / 1e6:.3f} ms "  # type: ignore[call-overload]
            f"(≤ {r['estimated_speedup']}×) | {r.get('recipe', '–')} | {measured} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--work", type=Path, default=Path("/tmp/op_targets"))
    parser.add_argument("--workloads", default=ALL)
    args = parser.parse_args()
    rows: list[dict[str, object]] = []
    args.out.mkdir(parents=True, exist_ok=True)
    for entry in args.workloads.split(","):
        added = calibrate(entry, args.work)
        rows += added
        print("\n".join(table(added).splitlines()[2:]), flush=True)
        (args.out / "calibration.json").write_text(json.dumps(rows, indent=1))  # each workload as it comes
    print(table(rows))


if __name__ == "__main__":
    main()
