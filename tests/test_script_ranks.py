"""A distributed script profiled as it is: launched by torchrun (`--script --nproc-per-node`), or starting its own
ranks with `torch.multiprocessing.spawn` (each spawned process profiled as a torchrun rank). Real captures on the
CPU (gloo, two ranks)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from fixtures_util import extract_fixture

from mcp_server import api
from mcp_server.children.script_ranks import SpawnedRanks, SpawnsRanks
from mcp_server.errors import WorkloadError
from mcp_server.rundir import RunDir
from mcp_server.schema.harness import load_harness
from mcp_server.schema.io import load_profile
from mcp_server.schema.ranks import RanksSummary
from mcp_server.schema.requests import CaptureOptions, Interpreter, ProfileRequest

SCRIPTS = REPO / "tests" / "scripts"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _profile(script: str, out: Path, *args: str, **options: object) -> api.ProfileRun:
    return api.profile(ProfileRequest(
        workload=SCRIPTS / script, output=out, project=out.parent, backend="torch",
        python=Interpreter(python=sys.executable),
        capture=CaptureOptions(script=True, script_args=list(args), **options),
    ))


def _check_ranks(run: Path) -> None:
    """Both ranks attributed as one process is: their Linears, the backward's all-reduce with its bucket's modules."""
    for rank in (0, 1):
        profile = load_profile(run / f"rank{rank}" / "profile.json")
        info = profile.capture_metadata.distributed
        assert info is not None and (info.rank, info.world_size, info.backend) == (rank, 2, "gloo")
        # the script's own DDP model: its modules are named as the script's `ddp.named_modules()` names them
        assert {m for bucket in info.ddp_buckets for m in bucket.modules} == {"module.0", "module.2"}
        mms = [op for op in profile.operators if op.operator_name == "aten::mm"]
        assert mms and {op.module_path for op in mms} == {"module.0", "module.2"}
        reduces = [op for op in profile.operators if op.operator_name == "gloo:all_reduce"]
        assert reduces and all(op.collective == "allreduce" and op.phase == "backward" for op in reduces)
        assert all(set(op.collective_modules) == {"module.0", "module.2"} for op in reduces)
        harness = load_harness(run / f"rank{rank}" / "torch" / "harness.json")
        assert harness is not None and harness.model_extra is not None
        assert harness.model_extra["steps"]["name"] == "SGD.step" and harness.model_extra["steps"]["seen"] == 4
    summary = RanksSummary.model_validate_json((run / "ranks.json").read_text(encoding="utf-8"))
    assert summary.world_size == 2 and summary.collectives >= 1
    assert all(times.communication_ns > 0 and times.compute_ns > 0 for times in summary.ranks)


def test_a_torchrun_script_is_profiled_rank_by_rank(tmp_path):
    run = tmp_path / "run"
    result = _profile("ddp_script_train.py", run, "--steps", "6", nproc_per_node=2)
    assert result.ranks is not None and result.ranks.world_size == 2
    _check_ranks(run)
    assert RunDir(run).read_manifest().distributed["nproc_per_node"] == 2


def test_a_script_spawning_its_ranks_is_profiled_as_torchrun_ranks(tmp_path):
    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "mcp_server.cli", "profile", "--script", str(SCRIPTS / "spawn_train.py"),
         "--backend", "torch", "-o", str(run), "--", "--ranks", "2", "--port", str(_free_port())],
        capture_output=True, text=True, cwd=REPO, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert ("profile: the script starts 2 processes with torch.multiprocessing.spawn; each is profiled as a torchrun "
            "rank (--nproc-per-node 2)") in done.stderr
    _check_ranks(run)
    assert RunDir(run).read_manifest().distributed["nproc_per_node"] == 2
    # the one-process attempt that found the spawn left nothing beside the ranks' folders
    assert not (run / "torch").exists()
    assert "2 ranks (ranks.json" in done.stdout and f"ranks: {run / 'ranks.json'}" in done.stdout
    leftovers = subprocess.run(["pgrep", "-f", str(run)], capture_output=True, text=True, check=False)
    assert leftovers.stdout.strip() == ""


def _line(script: Path, marker: str) -> str:
    """`path:line` of the line of `script` ending with `# marker`."""
    lines = script.read_text(encoding="utf-8").splitlines()
    return f"{script}:{next(n for n, text in enumerate(lines, 1) if text.endswith(f'# {marker}'))}"


def test_what_ddp_runs_by_itself_takes_the_line_that_caused_it(tmp_path):
    """DDP's buffer broadcast (no torch call of the script's around it) is at the line that called the DDP model;
    its reducer's all-reduce, division and copies, run from C++ hooks in the backward, at the backward's line (the
    all-reduce and division had taken the line of the forward call whose gradient node finished the bucket) and in
    the backward phase (the copies had read as the optimizer's update); gloo's own records of the transfers, on its
    threads, at their calls' lines. Nothing is left without a line."""
    script = SCRIPTS / "ddp_bn_train.py"
    forward, backward = _line(script, "FORWARD"), _line(script, "BACKWARD")
    run = tmp_path / "run"
    _profile("ddp_bn_train.py", run, "--steps", "6", nproc_per_node=2)
    for rank in (0, 1):
        profile = load_profile(run / f"rank{rank}" / "profile.json")
        assert [op.operator_name for op in profile.operators if op.call_site is None] == []
        broadcasts = [op for op in profile.operators if op.operator_name in ("c10d::broadcast_", "gloo:broadcast")]
        assert len(broadcasts) >= 2 and {op.call_site for op in broadcasts} == {forward}
        reducer = [op for op in profile.operators if op.operator_name.startswith((
            "c10d::allreduce_", "gloo:all_reduce", "torch::distributed::reducer", "torch.distributed.ddp.reducer"))]
        assert {op.operator_name.split("::")[0] for op in reducer} == {
            "c10d", "gloo:all_reduce", "torch", "torch.distributed.ddp.reducer"}
        assert {(op.phase, op.call_site) for op in reducer} == {("backward", backward)}


def test_spawned_ranks_must_match_torchrun_s(tmp_path):
    with pytest.raises(WorkloadError, match=r"^rank 0: the script spawns 2 processes and torchrun runs 1 rank\(s\) on "
                                            r"this node: pass --nproc-per-node 2"):
        _profile("spawn_train.py", tmp_path / "run", "--port", str(_free_port()), nproc_per_node=1)


def _setup(rank: int, world: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world)


def _rank_by_helper(index: int) -> None:
    _setup(index, 2)


class _Trainer:
    def __init__(self, rank: int) -> None:
        from torch.nn.parallel import DistributedDataParallel

        self.model = DistributedDataParallel


def _rank_by_class(index: int) -> None:
    _Trainer(index)


def _pool_worker(index: int, rows: int) -> list[int]:
    return [index] * rows


def test_a_spawned_function_that_joins_a_process_group_starts_ranks_any_other_a_pool():
    import functools

    from mcp_server.children.script_ranks import joins_process_group

    sys.path.insert(0, str(SCRIPTS))
    try:
        import spawn_pool_train
        import spawn_train
    finally:
        sys.path.remove(str(SCRIPTS))
    assert joins_process_group(spawn_train.worker)  # init_process_group in its own code
    assert joins_process_group(_rank_by_helper) and joins_process_group(_rank_by_class)  # through the script's calls
    assert joins_process_group(functools.partial(_rank_by_helper))
    assert not joins_process_group(spawn_pool_train.make_shard) and not joins_process_group(_pool_worker)
    assert not joins_process_group(lambda index: index + 1)
    assert joins_process_group(print)  # no code to read: a rank, as every spawn was before pools were told apart


def test_spawn_outside_torchrun_runs_one_process_here_and_names_more(monkeypatch):
    import torch.distributed as dist
    import torch.multiprocessing as mp

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    original = mp.spawn
    seen: list[tuple[int, str]] = []

    def rank(index: int, word: str) -> None:
        seen.append((index, word))
        if not word:
            dist.init_process_group("gloo")  # what makes a spawned function a rank's

    spawned = SpawnedRanks().install()
    try:
        assert mp.spawn(rank, args=("x",), nprocs=1) is None
        context = mp.start_processes(rank, args=("late",), nprocs=1, join=False)
        assert context is not None and context.join() is True
        with pytest.raises(SpawnsRanks, match="starts 3 processes") as raised:
            mp.spawn(rank, args=("never",), nprocs=3)
        assert raised.value.details == {"ranks": 3}
    finally:
        spawned.remove()
    assert seen == [(0, "x"), (0, "late")] and spawned.spawned == 3 and spawned.warnings == []
    assert mp.spawn is original


def test_a_script_preparing_data_in_a_spawned_pool_is_profiled_in_its_own_process(tmp_path):
    """Its workers join no process group: they run as the script starts them, unprofiled (said), and its training
    steps are profiled in one process (it had been relaunched as two torchrun ranks, each failing to find the
    shards a pool that never ran should have written)."""
    run = tmp_path / "run"
    result = _profile("spawn_pool_train.py", run, "--workers", "2")
    assert result.ranks is None and not (run / "rank0").exists()
    profile = load_profile(run / "profile.json")
    assert profile.capture_metadata.distributed is None
    assert "the script's 2 process(es) of make_shard (torch.multiprocessing, joining no process group) ran as it " \
           "started them, unprofiled: only this process's work is in the profile" in profile.warnings
    assert {op.module_path for op in profile.operators if op.operator_name == "aten::linear"} == {"0", "2"}
    leftovers = subprocess.run(["pgrep", "-f", "spawn_pool_train"], capture_output=True, text=True, check=False)
    assert leftovers.stdout.strip() == ""


def test_ddp_forwards_count_the_iterations_ddp_times():
    """DDP times its reducer's first 10 iterations and every 100th; a forward that will not all-reduce (no_sync, or
    without grad) is not one of its iterations."""
    import torch

    from mcp_server.children.distributed import DdpForwards, ddp_times

    assert [n for n in range(0, 301) if ddp_times(n)] == [*range(1, 11), 100, 200, 300]

    class Ddp:
        require_backward_grad_sync = True

    model, forwards = Ddp(), DdpForwards()
    for step in range(14):
        with forwards.inside() if step in (3, 12) else torch.enable_grad():
            model.require_backward_grad_sync = False  # the first micro-batch, under no_sync()
            forwards.seen(model)
            model.require_backward_grad_sync = True
            forwards.seen(model)
            with torch.no_grad():  # an evaluation forward
                forwards.seen(model)
    assert forwards.timed == [3] and not forwards.window_open


def test_a_spawning_script_recorded_on_two_h200s_replays(tmp_path_factory, tmp_path):
    """`benchmarks/ranks_gpu_check.py --workload tests/scripts/spawn_train.py --script --profile-only --pack ...` on
    two H200s (nccl): the ranks' windows lined up, DDP's timing of its 4th iteration told apart from the script's
    own synchronisations."""
    from mcp_server.analysis import analyze_profile
    from mcp_server.schema.requests import AssembleRequest

    run = extract_fixture("h200x2_spawn_train", tmp_path_factory) / "spawn"
    result = api.assemble(AssembleRequest(run_dir=run))
    assert result.ranks is not None and result.ranks.world_size == 2 and not result.ranks.stragglers
    windows = [times.window_ns for times in result.ranks.ranks]
    assert max(windows) < 1.2 * min(windows)  # lined up: no rank waits out another's collection start
    for rank in (0, 1):
        profile = load_profile(run / f"rank{rank}" / "profile.json")
        info = profile.capture_metadata.distributed
        assert info is not None and (info.rank, info.backend, info.device) == (rank, "nccl", f"cuda:{rank}")
        assert info.ddp_timed_iterations == [3]
        assert profile.window.attributed_kernel_time_pct == pytest.approx(100.0)
        (reduce,) = [op for op in profile.operators if op.collective == "allreduce"]
        assert reduce.phase == "backward" and set(reduce.collective_modules) == {"module.0", "module.2"}
        timing = [e for e in profile.runtime_events if e.origin == "ddp_timing"]
        assert len(timing) == 8 and all(e.api == "cudaEventSynchronize" and e.phase == "forward" for e in timing)
        assert not [e for e in profile.runtime_events if e.origin == "workload" and e.synchronizing]
        assert any(w.startswith("8 cudaEventSynchronize call(s) in DistributedDataParallel's forward are DDP's own "
                                "timing") for w in profile.warnings)
        assert not any("synchronising call(s) inside the window" in w for w in profile.warnings)
        analysis = analyze_profile(profile, tmp_path / f"analysis{rank}", measure=False)
        assert not [s for s in analysis.syncs if s.synchronizing]  # nothing of DDP's told to the user to remove


def test_a_rank_whose_peers_never_reach_the_window_goes_on_and_says_so(monkeypatch):
    import time

    import torch.distributed as dist

    from mcp_server.children import distributed

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        warnings: list[str] = []
        line_up = distributed.WindowLineUp(warnings)
        line_up()  # one rank: every rank is there
        assert line_up.windows == 1 and warnings == []
        monkeypatch.setattr(distributed, "LINE_UP_TIMEOUT_S", 0.2)
        monkeypatch.setattr(dist, "get_world_size", lambda *args: 2)  # a peer that never comes
        t0 = time.monotonic()
        line_up()
        line_up()  # given up: the next window does not wait again
        assert time.monotonic() - t0 < 2.0
        assert warnings == ["window 2: the other ranks did not reach their window within 0.2 s; the ranks' windows are "
                            "not lined up"]
    finally:
        dist.destroy_process_group()


def test_an_fsdp2_script_spawning_its_ranks_keeps_its_model_s_names(tmp_path):
    """`fully_shard` makes each sharded module an instance of a class of its own (FSDPLanguageModel): the model
    keeps its own class's name, and each unit's all-gathers and reduce-scatters carry the unit's modules."""
    run = tmp_path / "run"
    workload = REPO / "scripts" / "gpu_workloads" / "fsdp_spawn_lm.py"
    api.profile(ProfileRequest(
        workload=workload, output=run, project=tmp_path, backend="torch", python=Interpreter(python=sys.executable),
        capture=CaptureOptions(script=True, script_args=["--small", "--steps", "12", "--port", str(_free_port())])))
    for rank in (0, 1):
        profile = load_profile(run / f"rank{rank}" / "profile.json")
        assert profile.capture_metadata.root_module == "LanguageModel"
        gathers = [op for op in profile.operators if op.operator_name == "gloo:all_gather"]
        scatters = [op for op in profile.operators if op.collective == "reducescatter"]
        assert gathers and scatters
        assert {op.module_path for op in gathers} >= {"blocks.0", "blocks.1"}
        assert not any((op.module_path or "").startswith("FSDP") for op in profile.operators)


def test_a_compiled_ddp_model_keeps_its_modules_and_buckets(tmp_path):
    """`torch.compile(DistributedDataParallel(model))`: Dynamo's DDP optimizer splits the graph at the buckets and runs
    the pieces as modules of its own (a GraphModule of `WrapperModule`s), which are not the script's modules; the
    DDP model is still seen, with its buckets and the iterations it timed."""
    run = tmp_path / "run"
    workload = REPO / "scripts" / "gpu_workloads" / "ddp_compiled_cnn.py"
    api.profile(ProfileRequest(
        workload=workload, output=run, project=tmp_path, backend="torch", python=Interpreter(python=sys.executable),
        capture=CaptureOptions(script=True, nproc_per_node=2,
                               script_args=["--small", "--steps", "12", "--bucket-mb", "1"])))
    for rank in (0, 1):
        harness = load_harness(run / f"rank{rank}" / "torch" / "harness.json")
        assert harness is not None and harness.model_extra is not None and harness.distributed is not None
        modules = harness.model_extra["modules"]
        assert "module.stages.2.3" in modules
        assert not [path for path, kind in modules.items() if kind in ("WrapperModule", "GraphModule")]
        assert harness.distributed["ddp_timed_iterations"] == [3]
        # the graphs trace the model DDP holds: their modules named under it, as the module ranges name them
        recorded = json.loads((run / f"rank{rank}" / "torch" / "inductor_provenance.json").read_text())
        assert recorded["traced_inside"] == "module"
        paths = {node["module_path"] for node in recorded["node_modules"].values() if "module_path" in node}
        assert "module.stages.2.3" in paths and all(p == "module" or p.startswith("module.") for p in paths)
        profile = load_profile(run / f"rank{rank}" / "profile.json")
        reduces = [op for op in profile.operators if op.operator_name == "gloo:all_reduce"]
        assert len(reduces) == 2  # split at the buckets: one all-reduce each
        covered = {m for op in reduces for m in op.collective_modules}
        assert {"module.stem.0", "module.stages.2.3", "module.head"} <= covered


def test_a_compiled_ddp_script_recorded_on_two_h200s_names_each_convolution_s_module(tmp_path_factory):
    """`ranks_gpu_check.py --workload scripts/gpu_workloads/ddp_compiled_cnn.py --script --nproc-per-node 2
    --profile-only --pack ...` on two H200s: `torch.compile(DDP(model))` traces the model DDP holds (`module`), split
    by Dynamo's DDP optimizer into one piece per bucket, whose node names repeat; every convolution, forward and
    backward, is in its own Conv2d, named as the module ranges name it."""
    from mcp_server.assemble.provenance import load_provenance
    from mcp_server.schema.requests import AssembleRequest

    run = extract_fixture("h200x2_ddp_compiled_cnn", tmp_path_factory) / "cnn"
    api.assemble(AssembleRequest(run_dir=run))
    for rank in (0, 1):
        provenance = load_provenance(run / f"rank{rank}" / "nsys" / "inductor_provenance.json")
        assert provenance.traced_inside == "module" and provenance.root_module == "DistributedDataParallel"
        profile = load_profile(run / f"rank{rank}" / "profile.json")
        info = profile.capture_metadata.distributed
        assert info is not None and len(info.ddp_buckets) == 2 and info.ddp_timed_iterations == [3]
        harness = load_harness(run / f"rank{rank}" / "nsys" / "harness.json")
        assert harness is not None and harness.model_extra is not None
        classes = harness.model_extra["modules"]
        convs = [op for op in profile.operators if op.operator_name.startswith("aten::convolution")]
        assert len(convs) == 14 and {op.phase for op in convs} == {"forward", "backward"}
        assert all(classes.get(op.module_path or "") == "Conv2d" for op in convs), {op.module_path for op in convs}
        assert not any("WrapperModule" in (op.module_path or "") for op in profile.operators)
        # DDP's reducer, from C++ hooks inside the compiled backward's node: at the backward's line
        reducer = [op for op in profile.operators if op.operator_name in ("c10d::allreduce_",
                                                                          "torch::distributed::reducer::mul_out")]
        assert len(reducer) == 25 and {op.phase for op in reducer} == {"backward"}
        assert {(op.call_site or "").rsplit("/", 1)[-1] for op in reducer} == {"ddp_compiled_cnn.py:64"}
        compute = [(op, k) for op in profile.operators for k in op.kernels if "nccl" not in k.kernel_name.lower()]
        at_root = sum(k.duration_ns for op, k in compute if op.module_path == "module")
        assert at_root < 0.12 * sum(k.duration_ns for _, k in compute)  # the optimizer's update and DDP's own
