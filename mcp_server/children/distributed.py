"""The harness's side of a multi-rank capture (standard library and torch only).

Under torchrun every rank runs the same harness: it joins the default process group from torchrun's
environment (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, ...) before `get_model_and_input()`, wraps the
model in DDP when the workload sets `DISTRIBUTED = "ddp"`, lines the ranks' windows up (`WindowLineUp`), and
records what the assembly needs to name each collective's modules: the parameters of every DDP bucket (DDP's
own logging data, read after the warm-up rebuilt its buckets). Paths given to the harness may carry
`%q{RANK}` (nsys's and ncu's spelling of an environment variable): each rank writes its own folder.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ANSI = re.compile(r"\x1b\[[0-9;]*m")  # nvidia-smi underlines its table's header on some drivers
RANK_ENV = re.compile(r"%q\{([A-Z_][A-Z0-9_]*)\}")
DISTRIBUTED_WRAPPERS = ("ddp",)
NCCL_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "CUDA_VISIBLE_DEVICES", "TORCH_DISTRIBUTED_")
TOPOLOGY_TIMEOUT_S = 10.0
LINE_UP_KEY = "operator_profiler/window/"  # the store's count of the ranks that reached window N
LINE_UP_TIMEOUT_S, LINE_UP_POLL_S = 60.0, 0.0005
DDP_TIMING_EVERY = 100  # DDP's runtime-logging sample rate (kDDPRuntimeLoggingSampleRate), unless a script sets one


def launched_by_torchrun() -> bool:
    """Whether this process is one rank of a torchrun launch (its environment names the world)."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def expand_rank(path: Path | None) -> Path | None:
    """`path` with every `%q{NAME}` replaced by the environment variable NAME (as nsys and ncu do)."""
    if path is None:
        return None
    return Path(RANK_ENV.sub(lambda m: os.environ.get(m.group(1), ""), str(path)))


def init_process_group(backend: str | None) -> dict[str, Any]:
    """Join the default process group from torchrun's environment (nccl on CUDA, gloo on the CPU, unless
    `backend` says otherwise); on CUDA this rank's device is its LOCAL_RANK. The facts of this rank."""
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    if cuda:
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(
                f"local rank {local_rank} has no GPU: this node has {torch.cuda.device_count()} visible GPU(s); "
                "lower --nproc-per-node")
        torch.cuda.set_device(local_rank)
    chosen = backend or ("nccl" if cuda else "gloo")
    if cuda and chosen == "nccl":
        dist.init_process_group(chosen, device_id=torch.device("cuda", local_rank))
    else:
        dist.init_process_group(chosen)
    return {**rank_facts(chosen), "topology": node_topology()}


def rank_facts(backend: str) -> dict[str, Any]:
    """The facts of this rank of the default process group (joined, with `backend`): its rank and world, where its
    peers meet, its device and its NCCL settings."""
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    return {
        "rank": dist.get_rank(), "world_size": dist.get_world_size(), "local_rank": local_rank,
        "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", "1")), "backend": backend,
        "master_addr": os.environ.get("MASTER_ADDR"), "master_port": os.environ.get("MASTER_PORT"),
        "device": f"cuda:{local_rank}" if cuda else "cpu",
        "nccl_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(NCCL_ENV_PREFIXES)},
    }


def node_topology() -> str | None:
    """The node's GPU topology as local rank 0 of a CUDA run reads it (`topology`); None on the other ranks."""
    import torch

    return topology() if torch.cuda.is_available() and int(os.environ.get("LOCAL_RANK", "0")) == 0 else None


def topology() -> str | None:
    """`nvidia-smi topo -m` as printed (the node's GPU, NVLink and PCIe links), or None without nvidia-smi."""
    try:
        done = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                              timeout=TOPOLOGY_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return ANSI.sub("", done.stdout).strip() if done.returncode == 0 else None


def wrap(model: Any, how: str | None) -> Any:
    """The model wrapped as the workload's `DISTRIBUTED` asks ("ddp"), else the model itself."""
    if how is None:
        return model
    if how not in DISTRIBUTED_WRAPPERS:
        raise ValueError(f"DISTRIBUTED = {how!r} is not one of {', '.join(DISTRIBUTED_WRAPPERS)}")
    import torch
    from torch.nn.parallel import DistributedDataParallel

    if torch.cuda.is_available():
        return DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
    return DistributedDataParallel(model)


def ddp_buckets(model: Any, root: str, wrapped: bool = False) -> list[dict[str, Any]]:
    """Every DDP bucket of the model's DDP instances, in reduction order: its size, parameters and modules
    (paths in the profiled model, whose forward ranges carry the same names).

    The buckets are the reducer's own (rebuilt by DDP's second iteration, so read after the window), their
    parameters matched to the model's by storage; DDP's parameter order (each module's own parameters that
    require a gradient, modules in `named_modules()` order, each once) serves its logging data's indices.
    `wrapped`: the harness wrapped the model, whose module ranges are named inside the wrapper (`0.conv`, not
    `module.0.conv`); `root` names the model."""
    from torch.nn.parallel import DistributedDataParallel

    buckets: list[dict[str, Any]] = []
    for prefix, ddp in _modules_of_type(model, DistributedDataParallel):
        inner = "" if wrapped and not prefix else (f"{prefix}.module" if prefix else "module")
        params = _reducer_params(ddp.module, inner, root)
        for index, group in enumerate(_bucket_groups(ddp, params)):
            members = [params[i] for i in group]
            buckets.append({
                "ddp": prefix or "(root)", "index": index,
                "numel": sum(numel for _, _, numel, _ in members),
                "parameters": [name for name, _, _, _ in members],
                "modules": list(dict.fromkeys(module for _, module, _, _ in members)),
                "module_numel": _numel_by_module(members),
            })
    return buckets


def _bucket_groups(ddp: Any, params: list[tuple[str, str, int, int]]) -> list[list[int]]:
    """Each bucket's parameter indices: from the reducer's buckets (their parameters, matched by storage), else
    from DDP's logging data (which it updates at some iterations only)."""
    by_storage = {pointer: i for i, (_, _, _, pointer) in enumerate(params)}
    try:
        groups = [[by_storage[p.data_ptr()] for p in bucket.parameters() if p.data_ptr() in by_storage]
                  for bucket in ddp.reducer._get_zeros_like_grad_buckets()]
    except (AttributeError, RuntimeError):
        groups = []
    if groups and all(groups):
        return groups
    indices = ddp._get_ddp_logging_data().get("rebuilt_per_bucket_param_indices") or ""
    return [[int(i) for i in group.split() if int(i) < len(params)] for group in indices.split(",") if group.strip()]


def _numel_by_module(members: list[tuple[str, str, int, int]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, module, numel, _ in members:
        counts[module] = counts.get(module, 0) + numel
    return counts


def _modules_of_type(model: Any, kind: type) -> list[tuple[str, Any]]:
    if isinstance(model, kind):
        return [("", model)]
    if not hasattr(model, "named_modules"):
        return []
    return [(path, m) for path, m in model.named_modules() if isinstance(m, kind)]


def _reducer_params(module: Any, prefix: str, root: str) -> list[tuple[str, str, int, int]]:
    """(parameter name, owning module path, numel, storage address) in DDP's reducer order."""
    seen: set[int] = set()
    found = []
    for path, sub in module.named_modules():
        for name, param in sub.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            owner = ".".join(part for part in (prefix, path) if part) or root
            found.append((f"{owner}.{name}", owner, param.numel(), param.data_ptr()))
    return found


def ddp_times(iteration: int) -> bool:
    """Whether DDP times the forward that follows `iteration` gradient-syncing forwards: its reducer's first 10
    iterations and every 100th (`Reducer::should_collect_runtime_stats`), whose times it reads from CUDA events
    of the iteration before, waiting for them (cudaEventSynchronize) as the forward starts."""
    return iteration > 0 and (iteration <= 10 or iteration % DDP_TIMING_EVERY == 0)


class DdpForwards:
    """Each DDP model's forwards that will all-reduce gradients (its reducer's iterations), counted as they start;
    `timed` holds the iterations DDP timed inside a window (`window_open`)."""

    def __init__(self) -> None:
        self.window_open = False
        self.timed: list[int] = []
        self._counts: dict[int, int] = {}

    def watch(self, model: Any) -> DdpForwards:
        """Count the forwards of every DDP model in `model` (the harness's own eager window; None: a compiled one,
        whose graph would trace the hook)."""
        from torch.nn.parallel import DistributedDataParallel

        for _, ddp in _modules_of_type(model, DistributedDataParallel) if model is not None else []:
            ddp.register_forward_pre_hook(lambda module, args: self.seen(module))
        return self

    def seen(self, ddp: Any) -> None:
        """A DDP model's forward starts."""
        import torch

        if not (torch.is_grad_enabled() and getattr(ddp, "require_backward_grad_sync", False)):
            return
        done = self._counts.get(id(ddp), 0)
        if self.window_open and ddp_times(done):
            self.timed.append(done)
        self._counts[id(ddp)] = done + 1

    @contextmanager
    def inside(self) -> Iterator[None]:
        """A window is open for the `with` body."""
        self.window_open = True
        try:
            yield
        finally:
            self.window_open = False


class WindowLineUp:
    """Every rank reaches its window's start before any goes on (under nsys once its collection started: nsys takes
    a different time to start on each rank, 0.32 to 0.38 s on two H200s, which the first collective would wait out
    inside the window). The ranks meet at the process group's store, launching nothing on the GPU (a collective
    barrier would put its own kernels in the window: under ncu, one replayed that the timeline's window lacks), and
    wait at most LINE_UP_TIMEOUT_S: a rank whose peers do not come (a window only some ranks open) goes on unaligned
    and says so in `warnings`, rather than hang."""

    def __init__(self, warnings: list[str]) -> None:
        self.warnings = warnings
        self.windows = 0  # the windows lined up so far
        self._lining_up = True

    def __call__(self) -> None:
        import torch
        import torch.distributed as dist

        if not (self._lining_up and dist.is_available() and dist.is_initialized()):
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.windows += 1
        store, key = dist.distributed_c10d._get_default_store(), f"{LINE_UP_KEY}{self.windows}"
        store.add(key, 1)
        deadline = time.monotonic() + LINE_UP_TIMEOUT_S
        while store.add(key, 0) < dist.get_world_size():
            if time.monotonic() > deadline:
                self._lining_up = False
                self.warnings.append(f"window {self.windows}: the other ranks did not reach their window within "
                                     f"{LINE_UP_TIMEOUT_S:g} s; the ranks' windows are not lined up")
                return
            time.sleep(LINE_UP_POLL_S)


def finish() -> None:
    """Leave the process group (each rank; a rank that failed before this is stopped by torchrun)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
