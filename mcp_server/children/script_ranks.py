"""The ranks of a script run as it is (standard library and torch only).

A distributed script is launched one of two ways: by torchrun (each rank runs the script, which joins the process
group from torchrun's environment), or by itself, `torch.multiprocessing.spawn(fn, args, nprocs)` starting one
process per rank. Both are profiled as torchrun ranks, every rank under the harness:

- `SpawnedRanks` replaces torch.multiprocessing's `spawn` and `start_processes` while the script runs. A function
  that joins a process group (`joins_process_group`: it, or a function or class of the script it names, names
  `init_process_group`, a device mesh, DDP or FSDP) starts ranks. Under torchrun the process is one of them: it
  calls `fn(LOCAL_RANK, *args)` itself (the index spawn would give that rank). Outside torchrun one process is called
  here, and more stop the script with `SpawnsRanks`, which names the count: the engine launches them again as
  torchrun ranks. Any other function starts a pool of workers (data preparation, say): spawned as the script asks,
  unprofiled, and said in the warnings.
- `RankFacts` records what the assembly needs of a rank once the script joined the process group: its rank, world
  and backend (read as a window closes: the script may leave the group before it ends), the buckets of the
  DistributedDataParallel models it called (once the windows are over, DDP having rebuilt its buckets in its second
  iteration) and the iterations DDP timed inside the windows; and it lines the ranks' windows up (`WindowLineUp`,
  at the process group's store).
"""

from __future__ import annotations

import functools
import inspect
import os
import types
from collections.abc import Callable
from typing import Any

from mcp_server.children.common import ContractError
from mcp_server.children.contract import SPAWNS_RANKS
from mcp_server.children.distributed import (
    DdpForwards,
    WindowLineUp,
    ddp_buckets,
    launched_by_torchrun,
    node_topology,
    rank_facts,
)
from mcp_server.children.global_modules import GlobalModules
from mcp_server.children.sites import UserFrames

AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
# Names a spawned function (or what it calls) uses when each process is a rank of a process group.
JOINS_GROUP = frozenset({"init_process_group", "init_device_mesh", "DistributedDataParallel", "fully_shard",
                         "FullyShardedDataParallel"})
SEARCH_DEPTH = 4  # calls deep: main -> setup -> ...


def joins_process_group(fn: Any, depth: int = SEARCH_DEPTH) -> bool:
    """Whether `fn` joins a process group: its code, a function nested in it, or a function or class method of the
    user's code it names (to `depth` calls deep; `UserFrames` tells the user's code from torch's, the standard
    library's and site-packages') names one of JOINS_GROUP. A callable whose code cannot be read counts as joining
    (as every spawned function did before pools were told apart)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    fn = inspect.unwrap(fn) if callable(fn) else fn
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        return True
    frames, seen = UserFrames(), set[types.CodeType]()

    def callees(value: Any) -> list[Any]:
        """The user's Python functions `value` stands for: itself, or a class's methods."""
        found = [v for v in vars(value).values() if inspect.isfunction(v)] if inspect.isclass(value) else (
            [inspect.unwrap(value)] if inspect.isfunction(value) else [])
        return [f for f in found if frames.is_user(f.__code__)]

    def names(code: types.CodeType, scope: dict[str, Any], left: int) -> bool:
        if code in seen:
            return False
        seen.add(code)
        if JOINS_GROUP & set(code.co_names):
            return True
        if any(isinstance(c, types.CodeType) and names(c, scope, left) for c in code.co_consts):
            return True
        return left > 0 and any(names(f.__code__, f.__globals__, left - 1)
                                for name in code.co_names for f in callees(scope.get(name)))

    return names(code, getattr(fn, "__globals__", {}), depth)


class SpawnsRanks(ContractError):
    """The script starts `ranks` processes with torch.multiprocessing: they are to be launched as torchrun ranks."""

    kind = SPAWNS_RANKS

    def __init__(self, ranks: int) -> None:
        super().__init__(f"the script starts {ranks} processes with torch.multiprocessing.spawn: each is a rank, "
                         "profiled under torchrun")
        self.details = {"ranks": ranks}


class _Finished:
    """What `spawn(..., join=False)` returns here: the rank's function has run already."""

    def join(self, timeout: float | None = None) -> bool:
        return True


class SpawnedRanks:
    """torch.multiprocessing's `spawn` and `start_processes`, run as the ranks of a torchrun launch."""

    def __init__(self) -> None:
        self.spawned: int | None = None  # the ranks the script asked for, once it asked
        self.warnings: list[str] = []
        self._saved: dict[str, Callable[..., Any]] = {}

    def install(self) -> SpawnedRanks:
        import torch.multiprocessing as mp

        self._saved = {"spawn": mp.spawn, "start_processes": mp.start_processes}
        mp.spawn = self._spawn
        mp.start_processes = self._spawn
        return self

    def remove(self) -> None:
        import torch.multiprocessing as mp

        for name, original in self._saved.items():
            setattr(mp, name, original)
        self._saved = {}

    def _spawn(self, fn: Callable[..., Any], args: tuple[Any, ...] = (), nprocs: int = 1, join: bool = True,
               daemon: bool = False, start_method: str = "spawn") -> Any:
        if not joins_process_group(fn):
            name = getattr(fn, "__qualname__", repr(fn))
            warning = (f"the script's {nprocs} process(es) of {name} (torch.multiprocessing, joining no process "
                       "group) ran as it started them, unprofiled: only this process's work is in the profile")
            if warning not in self.warnings:
                self.warnings.append(warning)
            return self._saved["start_processes"](fn, args, nprocs, join, daemon, start_method)
        self.spawned = nprocs
        if launched_by_torchrun():
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            if nprocs != local:
                raise ContractError(f"the script spawns {nprocs} processes and torchrun runs {local} rank(s) on this "
                                    f"node: pass --nproc-per-node {nprocs}")
            index = int(os.environ.get("LOCAL_RANK", "0"))
            # A spawned rank meets its peers where the script says (its own MASTER_PORT, or init_method), not at
            # torchrun's store, which init_process_group would otherwise wait on as a client of any MASTER_PORT.
            os.environ.pop(AGENT_STORE_ENV, None)
        elif nprocs > 1:
            raise SpawnsRanks(nprocs)
        else:
            index = 0
        fn(index, *args)
        return None if join else _Finished()


class RankFacts:
    """This rank's facts (`rank_facts`, taken as a window closes while the script's process group is up: the script
    may destroy it before it ends), its DDP models' buckets and the iterations DDP timed in the windows; and the
    ranks' windows lined up (`line_up`)."""

    def __init__(self, modules: GlobalModules, is_open: Callable[[], bool]) -> None:
        self.facts: dict[str, Any] | None = None
        self.warnings: list[str] = []
        self.forwards = DdpForwards()
        self._modules, self._is_open = modules, is_open
        self._ddp: dict[str, Any] = {}  # the path of each DDP model called as a root -> the model
        self.line_up = WindowLineUp(self.warnings)  # each window's start, once its profiler started
        modules.listeners.append(self._seen)

    def _seen(self, module: Any, path: str, started: bool, args: tuple[Any, ...]) -> None:
        from torch.nn.parallel import DistributedDataParallel

        if started and not self._modules.inside_call() and isinstance(module, DistributedDataParallel):
            self._ddp.setdefault(path, module)
            self.forwards.window_open = self._is_open()
            self.forwards.seen(module)

    def window_closed(self) -> None:
        """Read the facts at the first window that closes once the script has joined a process group."""
        import torch.distributed as dist

        if self.facts is None and dist.is_available() and dist.is_initialized():
            self.facts = rank_facts(dist.get_backend())

    def finish(self) -> dict[str, Any] | None:
        """The rank's facts, with its DDP models' buckets, the iterations DDP timed in the windows and
        the node's topology (read once the windows are over); None when the script joined no process group while a
        window closed."""
        if self.facts is not None:
            # read now, not as a window closes: reading the reducer's buckets allocates zeros, a kernel of ours
            self.facts["ddp_buckets"] = [bucket for path, model in self._ddp.items()
                                         for bucket in ddp_buckets(model, path, wrapped=False)]
            self.facts["ddp_timed_iterations"] = self.forwards.timed
            self.facts["topology"] = node_topology()
        return self.facts
