"""One process driving two GPUs with NCCL's collectives: an `nn.DataParallel` training step broadcasts its weights
(`ncclDevKernel_Broadcast_RING_LL`) and reduces its gradients across the GPUs at every step.

ncu failed on it: replaying an NCCL kernel alone waits for a peer that is not replaying it, and, with NCCL's kernels
left out, the next kernel failed too ("==ERROR== UnknownError", exit code 9): NCCL maps its buffers itself (cuMem,
NVLink SHARP's multicast), and ncu cannot save and restore them around a replay. A probe on two H200s (a 3-line
DataParallel script under `ncu -c 40`): UnknownError with NCCL's kernels replayed or not, with `--devices 0`,
`--cache-control none` or `--replay-mode application`; every kernel replayed with `NCCL_CUMEM_ENABLE=0
NCCL_NVLS_ENABLE=0` (as with `NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1`). So no ncu pass replays a collective's kernel,
and each runs with NCCL's classic allocations (`plugins.ncu.command`).

`h200_dataparallel_train.tar.xz`: scripts/gpu_workloads/dataparallel_train.py as it is (`run --script --steps 3:1` on
two H200s, all its passes), recorded by `scripts/record_real_workloads.py --cases dataparallel_train` on 2026-11-30
once these fixes were in. Its analysis names the wrapper as what to replace (DistributedDataParallel) before the
window can be captured in a CUDA graph.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from fixtures_util import extract_fixture

from mcp_server.analysis import analyze_profile
from mcp_server.analysis.data_parallel import NEED as DATA_PARALLEL_NEED
from mcp_server.backends.registry import assemble
from mcp_server.rundir import RunDir
from plugins.ncu.command import REPLAY_ENV, is_collective, replay_env, replayed_kernels


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory):
    return extract_fixture("h200_dataparallel_train", tmp_path_factory) / "dataparallel_train"


def test_every_kernel_but_the_collectives_carries_counters(recorded) -> None:
    profile = assemble(RunDir(recorded))
    assert profile.capture_metadata.tool == "nsys+ncu"
    without = Counter(k.kernel_name.split("_RING")[0] for op in profile.operators for k in op.kernels
                      if not k.metrics)
    assert without == {"ncclDevKernel_Broadcast": 6, "ncclDevKernel_Reduce_Sum_f32": 2}
    assert profile.window.no_counter_kernel_time_pct < 2
    # the collectives are no replay's launches: no disagreement between the captures is reported
    assert not any("nsys/ncu mismatch" in w for w in profile.warnings)
    manifest = json.loads((recorded / "manifest.json").read_text())
    command = next(p["command"] for p in manifest["passes"] if p["name"] == "ncu")
    assert command[command.index("--kernel-name") + 1] == "regex:" + replayed_kernels(None)


def test_a_dataparallel_steps_replicas_add_up_under_the_model_they_copy(recorded) -> None:
    profile = assemble(RunDir(recorded))
    assert profile.window.attributed_kernel_time_pct == 100.0
    assert profile.capture_metadata.root_module == "DataParallel"
    convolutions = Counter((k.device_id, op.module_path, op.phase) for op in profile.operators for k in op.kernels
                           if op.operator_name == "aten::conv2d" or op.operator_name == "aten::cudnn_convolution")
    # each GPU's replica ran the first convolution under the path of the module it copies
    assert {(device, path) for device, path, _ in convolutions if path == "module.features.0"} == {
        (0, "module.features.0"), (1, "module.features.0")}
    roots = {(op.module_path or "").split(".")[0] for op in profile.operators if op.kernels}
    assert roots <= {"", "module", "DataParallel"}  # no replica a model of its own
    harness = json.loads((recorded / "nsys" / "harness.json").read_text())
    assert not any(path.startswith("Net") for path in harness["modules"])


def test_the_replay_leaves_collectives_out_and_runs_with_nccls_classic_allocations() -> None:
    pattern = re.compile(replayed_kernels(None))
    assert not pattern.search("_Z28ncclDevKernel_Broadcast_RING_LLP24ncclDevKernelArgsStorageILm4096EE")
    assert pattern.search("_ZN2at6native40_GLOBAL__N__0f1a8107_8_Shape_cu_49f7391c30CatArrayBatchedCopy_vectorized")
    assert is_collective("ncclKernel_AllGather_RING_LL_Sum_int8_t") and not is_collective("triton_poi_fused_0")
    assert replay_env({"PATH": "/bin"}) == {"PATH": "/bin", **REPLAY_ENV}
    assert replay_env({"NCCL_CUMEM_ENABLE": "1"})["NCCL_CUMEM_ENABLE"] == "1"  # the user's own setting kept


def test_the_analysis_names_dataparallel_and_asks_for_ddp_before_cuda_graphs(recorded, tmp_path_factory,
                                                                             tmp_path) -> None:
    """The replication's measured cost as a finding, and DistributedDataParallel the change that must come before
    capturing the window; a model split by hand across two GPUs (`h200_two_gpu_pipeline`) is not DataParallel."""
    analysis = analyze_profile(assemble(RunDir(recorded)), tmp_path / "dp", measure=False)
    finding = next(f for f in analysis.findings if f.kind == "data_parallel")
    assert finding.title == "nn.DataParallel replicates the model onto 2 GPUs at every call, from one process"
    assert "collective_kernel_pct=1.7" in finding.triggers and "device_overlap_ns=333115" in finding.triggers
    graphs = next(o for o in analysis.opportunities if o.change_class == "cuda_graphs")
    assert graphs.title.endswith("— first replace nn.DataParallel by DistributedDataParallel")
    assert DATA_PARALLEL_NEED in graphs.prerequisites
    split = extract_fixture("h200_two_gpu_pipeline", tmp_path_factory) / "two_gpu_pipeline"
    other = analyze_profile(assemble(RunDir(split)), tmp_path / "split", measure=False)
    assert not any(f.kind == "data_parallel" for f in other.findings)
    assert not any(DATA_PARALLEL_NEED in o.prerequisites for o in other.opportunities)
