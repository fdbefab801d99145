"""The capture's shape as data: the pass plan (a pure function, no threads), the harness's flags (one table both
sides read) and harness.json's one typed reader."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mcp_server.backends.registry import REGISTRY
from mcp_server.capture.plan import BYTECODE, TIMING_WINDOWS, gpu_order, plan_passes
from mcp_server.capture.request import CaptureRequest, GpuTurn, Torchrun, WorkloadOptions, harness_command
from mcp_server.capture.schedule import cpu_share
from mcp_server.children.contract import HARNESS_FLAGS, harness_argv, harness_parser
from mcp_server.errors import ProfileFormatError
from mcp_server.rundir import RunDir
from mcp_server.schema.harness import HarnessResult, load_harness


def _plan(**given):
    asked = dict(backend="nsys", counters=True, whole_window=True, timing=True, compile_mode="eager", warmup_iters=3,
                 precompiling=True)
    asked.update(given)
    backend = REGISTRY[asked.pop("backend")]
    return {p.name: p for p in plan_passes(backend, **asked)}


def test_a_run_on_a_gpu_takes_the_gpu_timing_nsys_ncu_then_the_variants():
    plan = _plan()
    assert gpu_order(list(plan.values())) == ["timing", "nsys", "ncu", "ncu_variants"]
    timing, nsys, ncu, variants = plan["timing"], plan["nsys"], plan["ncu"], plan["ncu_variants"]
    assert (timing.after, timing.done, timing.windows, timing.best_effort) == (BYTECODE, "timing", TIMING_WINDOWS, True)
    assert (nsys.after, nsys.done, nsys.warm_up_early, nsys.runner) == ("timing", "nsys", True, "main")
    assert (ncu.after, ncu.done, ncu.warm_up_early, ncu.retry_after) == ("nsys", "ncu", True, "timing")
    assert (variants.after, variants.done, variants.runner, variants.suspended) == ("ncu", None, "main", True)
    assert variants.warmup_iters == 1 and variants.import_compiler_early
    assert variants.started_after == (BYTECODE, "nsys")


def test_what_the_plan_leaves_out_and_who_warms_up_early():
    assert list(_plan(backend="torch", counters=False, timing=False)) == ["torch"]
    alone = _plan(backend="torch", counters=False, timing=False)["torch"]
    assert not alone.locked and alone.after is None and alone.done is None
    assert gpu_order(list(_plan(backend="torch", counters=False).values())) == ["timing", "torch"]
    # counters need nsys: the torch backend plans no ncu pass even when counters were asked for
    assert "ncu" not in _plan(backend="torch")
    assert "ncu_variants" not in _plan(whole_window=False)
    no_timing = _plan(timing=False, precompiling=False)
    assert gpu_order(list(no_timing.values())) == ["nsys", "ncu", "ncu_variants"]
    assert no_timing["nsys"].after is None and not no_timing["nsys"].warm_up_early
    assert no_timing["ncu"].retry_after is None and no_timing["ncu_variants"].started_after == ()
    optimized = _plan(compile_mode="optimized")  # the user's optimize() may autotune: nothing warms up early
    assert not optimized["nsys"].warm_up_early and not optimized["ncu"].warm_up_early
    assert _plan(compile_mode="cudagraphs", warmup_iters=4)["ncu_variants"].warmup_iters == 4
    assert _plan(compile_mode="inductor", warmup_iters=4)["ncu_variants"].warmup_iters == 1
    # a script's window is the steps after its warm-up: the variant pass replays the same steps' module calls
    assert _plan(warmup_iters=4, script=True)["ncu_variants"].warmup_iters == 4


def test_the_harness_command_is_written_and_parsed_from_one_table(tmp_path):
    req = CaptureRequest(
        workload=Path("w.py"), run_dir=RunDir(tmp_path), python="python",
        options=WorkloadOptions(compile_mode="inductor", warmup_iters=2, iters=3, seed=7, train_step=True),
        turn=GpuTurn(lock=tmp_path / "lock", after=tmp_path / "after", done=tmp_path / "done", warm_up_early=True,
                     windows=5, replay_calls=tmp_path / "calls.json"),
        torchrun=Torchrun(2, dist_backend="gloo"))
    command = harness_command(req, "kernels", "timing")
    args = harness_parser().parse_args(command[command.index("--workload"):])
    assert (args.compile_mode, args.warmup_iters, args.iters, args.seed, args.train_step) == ("inductor", 2, 3, 7, True)
    assert (args.gpu_lock, args.gpu_lock_after, args.gpu_lock_done) == (tmp_path / "lock", tmp_path / "after",
                                                                        tmp_path / "done")
    assert args.warm_up_early and args.windows == 5 and args.dist_backend == "gloo" and args.profiler == "kernels"
    assert args.kineto_trace == RunDir(tmp_path).kineto_trace("timing").resolve()
    assert args.provenance == RunDir(tmp_path).provenance("timing").resolve()
    assert not args.queue_ahead and not args.run_script and args.script_arg == []


def test_every_flag_round_trips_and_unknown_names_are_refused():
    values = {}
    for flag in HARNESS_FLAGS:
        values[flag.name] = {"switch": True, "repeat": ["--lr", "0.1"], "int": 4, "path": Path(f"/{flag.name}"),
                             "choice": flag.choices[-1] if flag.choices else None, "str": "x"}[flag.kind]
    parsed = vars(harness_parser().parse_args(harness_argv(values)))
    assert parsed == values
    with pytest.raises(KeyError, match="not harness flags"):
        harness_argv({"no_such_flag": 1})
    assert harness_argv({"train_step": False, "windows": None, "script_arg": ()}) == []


def test_harness_json_is_read_through_one_model(tmp_path):
    written = {"status": "ok", "phase": "finish", "workload_kind": "contract", "artifacts": ["kineto_trace.json"],
               "window": {"wall_time_ns": 5, "gpu_elapsed_ns": 4, "iters": 1}, "root_module": "Net",
               "windows": [{"wall_time_ns": 9, "gpu_elapsed_ns": 8}], "phase_started_at": {"import": 1.0}}
    path = tmp_path / "harness.json"
    path.write_text(json.dumps(written))
    result = load_harness(path)
    assert result is not None and result.ok and result.the_window.gpu_elapsed_ns == 4
    assert result.windows is not None and result.windows[0].gpu_elapsed_ns == 8
    assert result.model_extra == {"phase_started_at": {"import": 1.0}}, "what the model does not type is kept"
    assert not result.may_run_backward and HarnessResult(workload_kind="steps").may_run_backward
    assert load_harness(tmp_path / "missing.json") is None
    path.write_text("{not json")
    with pytest.raises(ProfileFormatError, match="is corrupt"):
        load_harness(path)


def test_passes_warming_up_at_once_share_the_cpus_and_a_lone_pass_keeps_them():
    cpus = len(os.sched_getaffinity(0))
    assert cpu_share(1) is None
    assert cpu_share(3) == max(1, cpus // 3)
    assert cpu_share(10 * cpus) == 1, "every pass keeps a thread"
