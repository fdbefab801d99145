"""Compiled modes: the torch.compile backends that record each FX graph's module metadata, the Inductor-cache
guard of an early compile, and the copy of Inductor's generated code (standard library and torch only)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from mcp_server.children.common import ContractError

INDUCTOR_CODE_DIR = "inductor_code"  # beside the provenance file; the file lists what it holds
CACHE_COUNTERS = ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass")


class NotCached(Exception):
    """A graph was compiled afresh in a pass that may only reuse Inductor's cache (--compile-early-if-cached)."""


def import_compiler(compile_mode: str) -> None:
    """Import TorchDynamo (and Inductor, which every compile mode but `optimized` uses) before the first CUDA
    call: a pass started suspended at that call (ncu's launch mode) then spends these seconds while it waits,
    not after. Imported in one go they cost a pass that does not wait more than the lazy imports of a cached
    compile (on the H100's host, import, build and warm-up took 12.0 s against 10.2 s), so only asked for."""
    import torch._dynamo  # noqa: F401

    if compile_mode != "optimized":
        import torch._inductor.compile_fx  # noqa: F401


def clean_module_path(raw: str) -> str:
    """`L['self'].features._modules['0'].conv` or `L['self'].features[0]` -> `features.0.conv`."""
    path = re.sub(r"^L\['self'\]\.?", "", raw)
    path = re.sub(r"\._modules\['([^']+)'\]", r".\1", path)
    path = re.sub(r"\[['\"]?([^\]'\"]+)['\"]?\]", r".\1", path)
    return path.strip(".")


def record_node_modules(gm: Any, into: dict[str, dict[str, str]]) -> None:
    """FX node name -> innermost nn.Module path and type, from each node's `nn_module_stack`."""
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            path, mtype = list(stack.values())[-1]
            into[node.name] = {
                "module_path": clean_module_path(str(path)),
                "module_type": getattr(mtype, "__name__", str(mtype)),
            }


class RecordingBackend:
    """Wraps a workload's registered torch.compile backend so its FX graphs' module metadata is recorded."""

    def __init__(self, module: Any) -> None:
        import torch

        name = getattr(module, "BACKEND_NAME", None)
        if not name or not callable(getattr(module, "optimize", None)):
            raise ContractError(
                "--compile-mode optimized needs BACKEND_NAME and optimize(model) (docs/optimized-workload-contract.md)"
            )
        from torch._dynamo.backends import registry

        self.node_modules: dict[str, dict[str, str]] = {}
        inner = torch._dynamo.lookup_backend(name)

        def recording(gm: Any, example_inputs: Any) -> Any:
            record_node_modules(gm, self.node_modules)
            compiled = inner(gm, example_inputs)
            record_node_modules(gm, self.node_modules)  # nodes the workload's own passes created in place
            return compiled

        registry._COMPILER_FNS[name] = recording
        self.optimize = module.optimize


class RecordingInductor:
    """torch.compile backend: records each FX graph's node -> nn.Module path, then compiles with Inductor.

    With `cached_only`, a graph that Inductor's FX graph cache did not hold raises NotCached once compiled,
    before any of it runs: its Triton kernels would autotune in this pass instead of reusing the configurations
    the previous pass chose. With `cpu_kernel_ranges` (torch.profiler on the CPU), each generated C++ kernel
    opens a profiler range of its own name, so its time is an operator's and not lost between them."""

    def __init__(self, compile_mode: str, cached_only: bool = False, cpu_kernel_ranges: bool = False) -> None:
        self.compile_mode = compile_mode
        self.cached_only = cached_only
        self.node_modules: dict[str, dict[str, str]] = {}
        self.patches: dict[str, object] = {}
        if compile_mode == "cudagraphs":
            self.patches["triton.cudagraphs"] = True
        if cpu_kernel_ranges:  # each generated C++ kernel records a profiler range named after it
            self.patches["cpp.enable_kernel_profile"] = True

    def __call__(self, gm: Any, example_inputs: Any) -> Any:
        from torch._dynamo.utils import counters
        from torch._inductor.compile_fx import compile_fx

        record_node_modules(gm, self.node_modules)
        before = dict(counters["inductor"])
        compiled = compile_fx(gm, example_inputs, config_patches=self.patches or None)
        grew = {key: counters["inductor"].get(key, 0) - before.get(key, 0) for key in CACHE_COUNTERS}
        if self.cached_only and (grew["fxgraph_cache_miss"] or grew["fxgraph_cache_bypass"]
                                 or not grew["fxgraph_cache_hit"]):
            raise NotCached(f"Inductor's FX graph cache did not hold a graph of {len(gm.graph.nodes)} nodes ({grew})")
        return compiled


def not_cached(exc: BaseException) -> NotCached | None:
    """The NotCached behind `exc`, which Dynamo wraps (BackendCompilerFailed keeps it as inner_exception)."""
    cause: BaseException | None = exc
    for _ in range(8):  # a bounded walk down the chain
        if cause is None or isinstance(cause, NotCached):
            return cause
        cause = getattr(cause, "inner_exception", None) or cause.__cause__ or cause.__context__
    return None


def inductor_provenance(backend: RecordingInductor | RecordingBackend, folder: Path) -> dict[str, Any]:
    """Copy every module Inductor generated in this process into `folder`/inductor_code, with the FX metadata.

    The engine reads the copies (kernel name -> original aten ops) and `node_modules` (FX node -> module
    path) to attribute generated kernels; nothing here depends on the generated code's format. The copies'
    paths are relative to `folder`.
    """
    from torch._inductor.codecache import PyCodeCache

    dest = folder / INDUCTOR_CODE_DIR
    dest.mkdir(exist_ok=True)
    copied: list[str] = []
    for module in list(PyCodeCache.modules):
        source = getattr(module, "__file__", None)
        if source and os.path.exists(source):
            name = f"{len(copied):03d}_{Path(source).name}"
            shutil.copyfile(source, dest / name)
            copied.append(f"{INDUCTOR_CODE_DIR}/{name}")
    return {"node_modules": backend.node_modules, "generated_code": copied}
