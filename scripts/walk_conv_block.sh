#!/usr/bin/env bash
# The optimization loop's GPU stages on examples/conv_block, as the optimize skill runs them through the MCP
# tools, here with the CLI commands that call the same engine functions:
# validate -> reprofile -> compare -> bench -> validate with the bench result -> analyze -> report.
# Run from the repository root on a GPU machine, after profile.json, analysis.json, optimizations.json,
# conv_block_optimized.py and test_conv_block_optimized.py exist in examples/conv_block/.
set -euo pipefail
dir=examples/conv_block
work=${WORK:-/tmp/op_walk}
rm -rf "$work" && mkdir -p "$work"
operator-profiler validate $dir/conv_block.py $dir/conv_block_optimized.py -o $dir -q
operator-profiler run $dir/conv_block_optimized.py --compile-mode optimized -o "$work/optimized" -q
cp "$work/optimized/profile.json" $dir/profile_optimized.json
operator-profiler compare $dir/profile.json $dir/profile_optimized.json -o $dir
operator-profiler bench $dir/conv_block.py $dir/conv_block_optimized.py -o $dir -q
operator-profiler validate $dir/conv_block.py $dir/conv_block_optimized.py --bench $dir/bench.json -o $dir -q
operator-profiler analyze $dir/profile_optimized.json -o "$work/optimized_analysis"
cp "$work/optimized_analysis/analysis.json" $dir/analysis_optimized.json
operator-profiler report $dir/profile.json --optimized-profile $dir/profile_optimized.json \
  --analysis $dir/analysis_optimized.json --comparison $dir/comparison.json --bench $dir/bench.json \
  --validation $dir/validation_report.json --optimizations $dir/optimizations.json -o $dir
