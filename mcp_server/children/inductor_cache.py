"""Inductor's caches, as a compiled pass meets them: the node records kept beside the cache for graphs AOTAutograd's
cache serves whole, the guard that refuses a fresh compile in a pass that may only reuse the cache, and the wait for
the tuned configurations of another pass (standard library and torch only)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mcp_server.children.common import write_json


class NotCached(Exception):
    """A graph was compiled afresh in a pass that may only reuse Inductor's cache (--warm-up-early)."""


GRAPH_RECORDS = "operator-profiler-graphs"  # in Inductor's cache folder: the node records of its cached graphs


def graph_scope(nodes: dict[str, dict[str, str]], root: str) -> str:
    """A digest of a Dynamo graph's module map: AOTAutograd's and Inductor's cache keys ignore node metadata, so
    two models that differ only in their modules' names share cached graphs, but not node records."""
    text = json.dumps({"root": root, "nodes": nodes}, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def graph_copy(gm: Any) -> Any:
    """A GraphModule with a copy of `gm`'s graph and of its `meta` (nodes and metadata dicts copied, values
    shared) and every other attribute of `gm` shared: what compiling `gm` changes in place stays out of it, and
    no tensor is copied."""
    import copy

    import torch

    graph = copy.deepcopy(gm.graph)
    for node, twin in zip(gm.graph.nodes, graph.nodes, strict=True):  # attributes Dynamo set on nodes
        for name, value in vars(node).items():
            twin.__dict__.setdefault(name, value)
    copied = torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    for name, value in vars(gm).items():
        copied.__dict__.setdefault(name, value)
    copied.meta = dict(gm.meta)  # Dynamo's facts about the graph, which GraphModule() starts empty
    return copied


def _records(scope: str) -> Path:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()) / GRAPH_RECORDS / scope


def _record_path(key: str, scope: str) -> Path:
    return _records(scope) / f"{key}.json"


def has_records(scope: str) -> bool:
    """Whether a pass that traced the Dynamo graph `scope` saved node records of its AOT graphs."""
    folder = _records(scope)
    return folder.is_dir() and any(folder.glob("*.json"))


def save_nodes(key: str, scope: str, nodes: dict[str, dict[str, str]]) -> None:
    """Keep the module map of the AOT graph cached under `key`, as traced for the Dynamo graph `scope`. Best
    effort: where it cannot be written, later passes trace the graph again."""
    path = _record_path(key, scope)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, nodes)  # passes of one run may save the same record at once
    except OSError:
        pass


def recall_nodes(key: str, scope: str) -> dict[str, dict[str, str]] | None:
    """The module map saved for the AOT graph cached under `key` and the Dynamo graph `scope`, if any."""
    try:
        nodes: dict[str, dict[str, str]] = json.loads(_record_path(key, scope).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return nodes


@contextmanager
def loaded_graphs(into: list[tuple[str, bool, Any]]) -> Iterator[None]:
    """While open: every graph Inductor's FX graph cache hands back goes into `into` as (key, backward, graph)
    (`FxGraphCache.load_with_key`, through which AOTAutograd's cache loads its forward and backward)."""
    import inspect

    from torch._inductor.codecache import FxGraphCache

    original = FxGraphCache.__dict__.get("load_with_key")
    function = getattr(original, "__func__", None)
    if function is None:
        yield
        return
    signature = inspect.signature(function)

    def load_with_key(*args: Any, **kwargs: Any) -> Any:
        loaded = function(*args, **kwargs)
        graph = loaded[0]
        if graph is not None:
            bound = signature.bind(*args, **kwargs).arguments
            into.append((str(bound["key"]), bool(bound.get("is_backward")), graph))
        return loaded

    FxGraphCache.load_with_key = staticmethod(load_with_key)
    try:
        yield
    finally:
        FxGraphCache.load_with_key = original


@contextmanager
def codegen_refused(refuse: bool, gm: Any) -> Iterator[None]:
    """While `refuse`: Inductor's code generation for a graph its FX graph cache missed (or cannot cache) raises
    NotCached instead of running (`compile_fx.fx_codegen_and_compile`, which a cache hit never calls)."""
    from torch._inductor import compile_fx as inductor

    original = getattr(inductor, "fx_codegen_and_compile", None)
    if not refuse or original is None:
        yield
        return

    def refused(*_args: Any, **_kwargs: Any) -> Any:
        raise NotCached(f"Inductor's FX graph cache did not hold a graph of {len(gm.graph.nodes)} nodes")

    inductor.fx_codegen_and_compile = refused
    try:
        yield
    finally:
        inductor.fx_codegen_and_compile = original


TUNED_CONFIG_WAIT_S = 30.0  # how long a kernel waits for the pass compiling its graph to save its tuned config
TUNED_CONFIG_POLL_S = 0.05
WAITING_FOR_TUNING = "waiting for the pass compiling this graph to save the tuned configuration of"
OTHER_TUNING_STEPS = ("coordinate_descent_tuning", "_combo_sequential_autotune")


def reuse_tuned_configurations(waited: list[str]) -> None:
    """For the rest of this process, a Triton kernel that would autotune at its first launch (Inductor's cache
    holds no tuned configuration for it yet) waits instead for the pass compiling its graph, which saved the graph
    before its first call tuned it, to save that configuration, and runs it; its name goes into `waited`. Past
    TUNED_CONFIG_WAIT_S, or for any other tuning step, NotCached (`CachingAutotuner`'s tuning steps)."""
    try:
        from torch._inductor.runtime import triton_heuristics as heuristics
    except ImportError:  # a torch without Inductor's Triton runtime: nothing can autotune
        return
    autotuner = heuristics.CachingAutotuner

    def wait_for_tuned(self: Any, *_args: Any, **_kwargs: Any) -> None:
        name = _kernel_name(self)
        configs = [launcher.config for launcher in self.launchers]
        deadline = time.monotonic() + TUNED_CONFIG_WAIT_S
        said = False
        while True:
            cached, _, _ = heuristics.check_autotune_cache(configs, self.filename, self.inductor_meta)
            if len(cached) == 1:
                best = heuristics.triton_config_to_hashable(cached[0])
                chosen = [launcher for launcher in self.launchers
                          if heuristics.triton_config_to_hashable(launcher.config) == best]
                if not chosen:
                    raise NotCached(f"the configuration tuned for {name} is none of those this pass compiled")
                self.launchers = chosen[:1]
                waited.append(name)
                return
            if time.monotonic() > deadline:
                raise NotCached(f"Inductor's cache held the graph but no tuned configuration of {name} after "
                                f"{TUNED_CONFIG_WAIT_S:.0f} s")
            if not said:
                print(f"{WAITING_FOR_TUNING} {name}", flush=True)
                said = True
            time.sleep(TUNED_CONFIG_POLL_S)

    def refused(self: Any, *_args: Any, **_kwargs: Any) -> Any:
        raise NotCached(f"{_kernel_name(self)} would tune itself in this pass")

    autotuner.autotune_to_one_config = wait_for_tuned
    for step in OTHER_TUNING_STEPS:
        if hasattr(autotuner, step):
            setattr(autotuner, step, refused)


def _kernel_name(autotuner: Any) -> str:
    return str(getattr(autotuner, "inductor_meta", {}).get("kernel_name", "a Triton kernel"))


def not_cached(exc: BaseException) -> NotCached | None:
    """The NotCached behind `exc`, which Dynamo wraps (BackendCompilerFailed keeps it as inner_exception)."""
    cause: BaseException | None = exc
    for _ in range(8):  # a bounded walk down the chain
        if cause is None or isinstance(cause, NotCached):
            return cause
        cause = getattr(cause, "inner_exception", None) or cause.__cause__ or cause.__context__
    return None
