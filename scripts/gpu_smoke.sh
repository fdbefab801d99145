#!/usr/bin/env bash
# On the GPU machine, from the repository root: the README's setup, then the CLI as a user runs it (progress on a
# pipe, a script window, a graph-break model, SIGTERM mid-run, a killed workload, profile then map). Prints what
# to check; writes only under /tmp.
set -u
REPO=$(pwd)
OP="$REPO/.venv/bin/operator-profiler"
echo "== setup (the README's command)"; (time python3 scripts/setup_env.py) 2>&1 | grep -vE "^WARNING|^\s*$" | tail -12
.venv/bin/python -c "import torch; print('venv torch', torch.__version__, 'cuda', torch.cuda.is_available())"
du -sh .venv
echo "== preflight"; "$OP" preflight; echo "exit $?"
cd /tmp || exit 1
echo "== run conv_block inductor, progress on a pipe"
( time "$OP" run "$REPO/examples/conv_block/conv_block.py" --compile-mode inductor -o /tmp/r1 ) >/tmp/r1.out 2>/tmp/r1.err
echo "exit $?; replay-count lines: $(grep -c replayed /tmp/r1.err); raw ==PROF== lines shown: $(grep -c '==PROF==' /tmp/r1.err)"
grep -E "replayed|ncu: " /tmp/r1.err | tail -3; grep -E "kernels:|real" /tmp/r1.out /tmp/r1.err
echo "== a script's own window"; "$OP" run "$REPO/tests/scripts/script_window.py" -o /tmp/s1 -q 2>&1 | grep -E "kernels:|error"
echo "== graph breaks, inductor"; "$OP" run "$REPO/scripts/gpu_workloads/graph_breaks.py" --compile-mode inductor -o /tmp/g1 -q 2>&1 | grep -E "kernels:|error"
echo "== SIGTERM 12 s into a run"; timeout -s TERM 12 "$OP" run "$REPO/examples/gpt2/gpt2.py" -o /tmp/t1 -q; echo "exit $?"
sleep 3; ps -eo pid,cmd | grep -E "nsys|ncu|children/harness" | grep -v grep || echo "no profiler or harness process left"
echo "== a workload killed outright"; "$OP" run "$REPO/tests/hostile/killed.py" -o /tmp/k1 2>&1 | tail -1
echo "== profile --backend nsys, then map"; "$OP" profile "$REPO/examples/mlp_activations/mlp_activations.py" --backend nsys -o /tmp/m2 -q 2>&1 | grep kernels:
"$OP" map /tmp/m2 2>&1 | grep -E "replayed|kernels:" | tail -3
