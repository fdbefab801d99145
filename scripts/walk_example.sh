#!/usr/bin/env bash
# The optimization loop's GPU stages on one example, as the optimize skill runs them through the MCP tools, here
# with the CLI commands that call the same engine functions: validate -> re-profile (compile mode optimized) ->
# analyze -> compare -> bench against eager, torch.compile and the tier's best free recipe -> validate with the
# bench result -> report. Usage, from the repository root on a GPU machine:
#   scripts/walk_example.sh conv_block
#   scripts/walk_example.sh lstm_sequence_encoder --allow-mismatch
# (the second form for a workload that replays a CUDA graph it captures itself: its kernels are unattributed, and
# compare refuses to pair operators unless told, as the optimize skill says) after profile.json, analysis.json, optimizations.json, proposal.md, implementation.md, <name>_optimized.py and
# its test exist in examples/<name>/. The precision tier is the plan's (optimizations.json).
set -euo pipefail
name=${1:?usage: scripts/walk_example.sh <example name, e.g. conv_block> [--allow-mismatch]}
compare_flags=()
case "${2:-}" in
  "") ;;
  --allow-mismatch) compare_flags=(--allow-mismatch) ;;
  *) echo "unknown option ${2}: the only option is --allow-mismatch" >&2; exit 2 ;;
esac
dir=examples/$name
[ -f "$dir/optimizations.json" ] || { echo "no $dir/optimizations.json: write the plan first" >&2; exit 2; }
tier=$(python -c 'import json, sys; print(json.load(open(sys.argv[1])).get("tier") or "exact")' "$dir/optimizations.json")
base=$dir/$name.py
opt=$dir/${name}_optimized.py
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
operator-profiler validate "$base" "$opt" --tier "$tier" --optimizations "$dir/optimizations.json" -o "$dir" --quiet
operator-profiler run "$opt" --compile-mode optimized --warmup-iters 3 --iters 1 --seed 0 -o "$work/optimized" --quiet
cp "$work/optimized/profile.json" "$dir/profile_optimized.json"
operator-profiler analyze "$dir/profile_optimized.json" -o "$dir/analysis_optimized"
operator-profiler compare "$dir/profile.json" "$dir/profile_optimized.json" "${compare_flags[@]}" -o "$dir"
operator-profiler bench "$base" "$opt" --baseline-mode eager -o "$dir" --quiet
operator-profiler bench "$base" "$opt" --baseline-mode inductor -o "$dir" --quiet
operator-profiler bench "$base" "$opt" --baseline-mode free --tier "$tier" -o "$dir" --quiet
operator-profiler validate "$base" "$opt" --tier "$tier" --optimizations "$dir/optimizations.json" \
  --bench "$dir/bench.json" --analysis "$dir/analysis.json" -o "$dir" --quiet
operator-profiler report "$dir/profile.json" --optimized-profile "$dir/profile_optimized.json" \
  --analysis "$dir/analysis_optimized/analysis.json" --baseline-analysis "$dir/analysis.json" \
  --comparison "$dir/comparison.json" --bench "$dir/bench.json" --bench-vs-compile "$dir/bench_vs_compile.json" \
  --bench-vs-free "$dir/bench_vs_free.json" --validation "$dir/validation_report.json" \
  --optimizations "$dir/optimizations.json" -o "$dir"
operator-profiler loop-status "$base"
