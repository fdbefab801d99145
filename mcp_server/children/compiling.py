"""Compiled modes: the torch.compile backends that record each FX graph's module metadata (kept beside Inductor's
cache for graphs AOTAutograd's cache serves whole: inductor_cache.py) and the copy of Inductor's generated code
(standard library and torch only)."""

from __future__ import annotations

import os
import re
import shutil
from contextlib import nullcontext, suppress
from pathlib import Path
from types import ModuleType
from typing import Any

from mcp_server.children import eager_hooks
from mcp_server.children.common import ContractError
from mcp_server.children.inductor_cache import (
    NotCached,
    codegen_refused,
    graph_copy,
    graph_scope,
    has_records,
    loaded_graphs,
    recall_nodes,
    reuse_tuned_configurations,
    save_nodes,
)
from mcp_server.children.naming import clean_module_path, root_module_name, user_site
from mcp_server.children.sites import dynamo_folds_has_torch_function, is_core, keep_out_of_dynamo

INDUCTOR_CODE_DIR = "inductor_code"  # beside the provenance file; the file lists what it holds
CACHE_COUNTERS = ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass")


def import_compiler(compile_mode: str) -> None:
    """Import TorchDynamo (and Inductor, which every compile mode but `optimized` uses) before the first CUDA
    call: a pass started suspended at that call (ncu's launch mode) then spends these seconds while it waits,
    not after. Imported in one go they cost a pass that does not wait more than the lazy imports of a cached
    compile (on the H100's host, import, build and warm-up took 12.0 s against 10.2 s), so only asked for."""
    import torch._dynamo  # noqa: F401

    if compile_mode != "optimized":
        import torch._inductor.compile_fx  # noqa: F401


def record_node_modules(gm: Any, into: dict[str, dict[str, str]], root: str = "", roots: tuple[str, ...] = (),
                        meta_key: str = "nn_module_stack", inside: str = "") -> None:
    """FX node name -> innermost nn.Module path and type (from each node's `meta_key`, `nn_module_stack` or a
    backward node's `fwd_nn_module_stack`) and the user's line that created it (`site`, from `stack_trace`).
    `inside`: the path, under the model, of the module whose forward the graph traced (a DDP wrapper's `module`)."""
    for node in gm.graph.nodes:
        stack = node.meta.get(meta_key) or node.meta.get("nn_module_stack")
        site = user_site(node.meta.get("stack_trace"), roots) if roots else None
        entry: dict[str, str] = {}
        if stack:
            path, mtype = list(stack.values())[-1]
            entry = {"module_path": _under(inside, clean_module_path(str(path), root), root),
                     "module_type": getattr(mtype, "__name__", str(mtype))}
        elif root and meta_key == "nn_module_stack" and node.op in ("call_function", "call_method"):
            entry = {"module_path": inside or root, "module_type": root}  # the forward's own, in no submodule
        if site:
            entry["site"] = site
        if entry:
            into[node.name] = entry


def _under(inside: str, path: str, root: str) -> str:
    return path if not inside else inside if path in ("", root) else f"{inside}.{path}"


def traced_inside(model: Any) -> str:
    """The path, under `model`, of the module whose forward Dynamo traces when `model` is compiled: a
    DistributedDataParallel wrapper runs its own forward eagerly and its `module`'s compiled; else the model's."""
    from torch.nn.parallel import DistributedDataParallel

    return "module" if isinstance(model, DistributedDataParallel) else ""


def graph_break(gm: Any) -> dict[str, str] | None:
    """The graph break that ended the Dynamo graph `gm` (its reason's first line and the user's `file:line`), or
    None when the graph ended with the function."""
    reason = getattr(gm, "compile_subgraph_reason", None)
    if reason is None or not getattr(reason, "graph_break", False):
        return None
    stack = list(getattr(reason, "user_stack", []) or [])
    location = f"{stack[-1].filename}:{stack[-1].lineno}" if stack else None
    text = str(getattr(reason, "reason", "")).strip()
    return {"reason": text.splitlines()[0] if text else "unknown", "location": location or "unknown",
            "detail": text[:2000]}


FALLBACK = "falling back to eager"  # what Dynamo says of a function it skipped, its graph break unhandled
SKIPPED = ": Dynamo skipped the function and ran it eagerly"  # how a skipped function's graph break ends
BREAK_AT = re.compile(r"Graph break in user code at (?P<location>\S+:\d+)")
FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+)')
OWN_BREAK = eager_hooks.__file__ + ":"  # the profiler's own break (`eager_hooks`): never the script's


class SkippedFunctions:
    """Graph breaks Dynamo could not handle, kept while in effect (as `with`): a break inside a loop, or in a
    function it cannot resume, makes it skip the whole function and run it eagerly, and no graph records that
    (only graphs that were compiled name the break that ended them). Read from Dynamo's `graph_breaks` log
    artifact, which this keeps out of the log while it listens."""

    def __init__(self, into: list[dict[str, str]]) -> None:
        import logging

        import torch._logging

        self.into = into
        self.logger = torch._logging.getArtifactLogger("torch._dynamo.symbolic_convert", "graph_breaks")
        recorder = self

        class _Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                recorder.heard(record.getMessage())

        self.handler = _Handler()
        self.saved: tuple[int, bool] = (0, True)  # the logger's level and propagation, put back on exit

    def __enter__(self) -> SkippedFunctions:
        import logging

        self.saved = (self.logger.level, self.logger.propagate)
        self.logger.addHandler(self.handler)
        self.logger.setLevel(logging.DEBUG)
        self.logger.propagate = False
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self.saved[0])
        self.logger.propagate = self.saved[1]

    def heard(self, message: str) -> None:
        """One graph-break message: kept when Dynamo skipped the function for it (once per place and reason)."""
        found = BREAK_AT.search(message)
        if FALLBACK not in message or found is None or found["location"].startswith(OWN_BREAK):
            return
        location = self.user_line(message) or found["location"]
        lines = [line.strip() for line in message.split("Graph break encountered:", 1)[-1].splitlines()
                 if line.strip()]
        why = next((line.removeprefix("Explanation:").strip() for line in lines if line.startswith("Explanation:")),
                   None)
        reason = (f"{lines[0] if lines else 'unknown'}" + (f" ({why})" if why else "")
                  + SKIPPED)
        if any(b["location"] == location and b["reason"] == reason for b in self.into):
            return
        self.into.append({"reason": reason, "location": location, "detail": message[:2000]})

    @staticmethod
    def user_line(message: str) -> str | None:
        """The innermost `path:line` of the user's code in the message's traceback: Dynamo names the frame it traced
        last, which is this package's when its call-site mode is on the stack (a script run as it is)."""
        frames = [f"{m['path']}:{m['line']}" for m in FRAME.finditer(message.split("User code traceback:", 1)[-1])
                  if not is_core(os.path.realpath(m["path"]))]
        return frames[-1] if frames else None


def compile_id() -> str | None:
    """The Dynamo compile id (`frame/attempt`, as `Torch-Compiled Region: 1/0` names it) being compiled."""
    from torch._guards import CompileContext

    found = CompileContext.current_compile_id()
    return None if found is None else str(found)


def uses_graph_trees(config_patches: dict[str, Any] | None) -> bool:
    """Whether Inductor, compiling with `config_patches` (what `torch.compile(mode=..., options=...)` hands it) over
    its global config, runs the graph under CUDA graph trees (`mode="reduce-overhead"`, `triton.cudagraphs`)."""
    from torch._inductor import config

    return bool((config_patches or {}).get("triton.cudagraphs", config.triton.cudagraphs))


class GraphRecorder:
    """What every recording backend keeps of the graphs it compiles: per Dynamo graph (by compile id) its nodes'
    modules and call sites, the graph break that ended it, and per Inductor graph (forward or backward) the
    same with its generated code and the FX-graph-cache key its runtime range names."""

    def __init__(self, root: str, inside: str = "") -> None:
        from mcp_server.children.sites import library_roots

        self.root = root
        self.inside = inside  # the module whose forward the graphs trace, under the model (`traced_inside`)
        self.roots = library_roots()
        self.node_modules: dict[str, dict[str, str]] = {}  # every graph's nodes, by name (names repeat)
        self.graphs: list[dict[str, Any]] = []
        self.graph_breaks: list[dict[str, str]] = []
        self.cuda_graph_trees = False  # a graph was compiled to run under CUDA graph trees
        self._inside = False  # a graph being recorded: Inductor compiling it for the backend records nothing more

    def dynamo_graph(self, gm: Any) -> dict[str, dict[str, str]]:
        """Record a graph Dynamo hands the backend; return its node map (filled again after compiling)."""
        nodes: dict[str, dict[str, str]] = {}
        record_node_modules(gm, nodes, self.root, self.roots, inside=self.inside)
        self.node_modules.update(nodes)
        current = compile_id()
        self.graphs.append({"compile_id": current, "kind": "dynamo", "node_modules": nodes})
        found = graph_break(gm)
        if found is not None:
            self.graph_breaks.append({**found, "compile_id": current or "unknown"})
        return nodes

    def inner_compile(self, gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        """Inductor's `compile_fx_inner`, recording the AOT graph it compiles (forward or backward)."""
        from torch._inductor.compile_fx import compile_fx_inner

        backward = bool(kwargs.get("is_backward"))
        meta_key = "fwd_nn_module_stack" if backward else "nn_module_stack"
        nodes: dict[str, dict[str, str]] = {}
        record_node_modules(gm, nodes, self.root, self.roots, meta_key, self.inside)
        compiled = compile_fx_inner(gm, example_inputs, **kwargs)
        record_node_modules(gm, nodes, self.root, self.roots, meta_key, self.inside)  # nodes post-grad passes made
        self.graphs.append({
            "compile_id": compile_id(), "kind": "backward" if backward else "forward",
            "fx_graph_cache_key": getattr(compiled, "_fx_graph_cache_key", None),
            "source_code": getattr(compiled, "source_code", None), "node_modules": nodes,
        })
        return compiled

    def record_inductor(self) -> None:
        """Record the graphs Inductor compiles for a `torch.compile` the backend registry never sees: with the
        default backend, or a `mode=` or `options=`, torch.compile calls Inductor's `compile_fx` through a wrapper
        of its own (`mode="reduce-overhead"`, the most common winner, among them). Each Dynamo graph's nodes and
        each AOT graph Inductor generates code for are recorded as under `--compile-mode inductor`. Patched for the
        rest of the process. AOTAutograd's cache is off for these compiles: a hit hands back graphs whose nodes
        no pass here saw (Inductor's own cache still serves their code)."""
        from torch._functorch import config as functorch_config
        from torch._inductor import compile_fx as inductor

        real, default_inner = inductor.compile_fx, inductor.compile_fx_inner

        def compile_fx(gm: Any, example_inputs: Any, inner_compile: Any = default_inner, **kwargs: Any) -> Any:
            self.cuda_graph_trees |= uses_graph_trees(kwargs.get("config_patches"))
            if self._inside:  # Inductor's own recursion, or a registered backend's graph already recorded
                return real(gm, example_inputs, inner_compile=inner_compile, **kwargs)
            self._inside = True
            try:
                nodes = self.dynamo_graph(gm)
                inner = self.inner_compile if inner_compile is default_inner else inner_compile
                with functorch_config.patch(enable_autograd_cache=False):
                    compiled = real(gm, example_inputs, inner_compile=inner, **kwargs)
            finally:
                self._inside = False
            self.node_modules.update(nodes)
            return compiled

        inductor.compile_fx = compile_fx


class RecordingBackend(GraphRecorder):
    """Wraps a workload's registered torch.compile backend so its FX graphs' module metadata is recorded."""

    def __init__(self, module: Any, root: str) -> None:
        import torch

        super().__init__(root)
        name = getattr(module, "BACKEND_NAME", None)
        if not name or not callable(getattr(module, "optimize", None)):
            raise ContractError(
                "--compile-mode optimized needs BACKEND_NAME and optimize(model) (docs/optimized-workload-contract.md)"
            )
        from torch._dynamo.backends import registry

        inner = torch._dynamo.lookup_backend(name)

        def recording(gm: Any, example_inputs: Any) -> Any:
            self._inside = True
            try:
                nodes = self.dynamo_graph(gm)
                compiled = inner(gm, example_inputs)
            finally:
                self._inside = False
            record_node_modules(gm, nodes, self.root, self.roots)  # nodes the workload's own passes created
            self.node_modules.update(nodes)
            return compiled

        registry._COMPILER_FNS[name] = recording
        self.record_inductor()
        self.optimize = module.optimize

class ScriptCompiles:
    """The graphs of every `torch.compile` a script calls, recorded as under `--compile-mode inductor` so that its
    generated kernels take their modules and lines: `torch.compile` is wrapped while the script runs, and Inductor is
    patched at its first call (a script that never compiles imports nothing more).

    With `reuse_tuned` (a pass that warms up beside the first compiling one), a Triton kernel about to autotune waits
    for that pass's tuned configuration instead (`reuse_tuned_configurations`): tuned in each pass, under another
    pass's load or under ncu, the same kernel could launch with another block size, and so another grid, than the
    timeline's; past the wait, the pass compiles again after that pass's window."""

    def __init__(self, reuse_tuned: bool = False, own: tuple[ModuleType, ...] = ()) -> None:
        import torch

        self.own = own  # modules whose code runs inside the script's calls (hooks, modes): never compiled as frames
        self.recorder: GraphRecorder | None = None
        self.skipped: SkippedFunctions | None = None  # listens from the first compile to the script's end
        self.reuse_tuned = reuse_tuned
        self.waited_for_tuning: list[str] = []  # kernels that waited for another pass's tuned configuration
        self._real = torch.compile
        torch.compile = self._compile

    def _compile(self, model: Any = None, *args: Any, **kwargs: Any) -> Any:
        import torch

        if self.recorder is None:
            owner = getattr(model, "__self__", model)  # `module.compile()` compiles its bound `_call_impl`
            model_owner = isinstance(owner, torch.nn.Module)
            self.recorder = GraphRecorder(root_module_name(owner) if model_owner else "",
                                          traced_inside(owner) if model_owner else "")
            self.recorder.record_inductor()
            self.skipped = SkippedFunctions(self.recorder.graph_breaks).__enter__()
            keep_out_of_dynamo(*self.own)  # the profiler's code the script runs: its module ranges, call sites
            dynamo_folds_has_torch_function()
            if self.reuse_tuned:
                reuse_tuned_configurations(self.waited_for_tuning)
        return self._real(model, *args, **kwargs)

    def remove(self) -> None:
        """Give torch its own `torch.compile` back (Inductor stays patched: graphs compiled later still record)."""
        import torch

        torch.compile = self._real
        if self.skipped is not None:
            self.skipped.__exit__(None, None, None)


class RecordingInductor(GraphRecorder):
    """torch.compile backend: records each FX graph's node -> nn.Module path, then compiles with Inductor.

    With `cached_only`, a graph that Inductor's FX graph cache does not hold raises NotCached before Inductor
    generates its code: its Triton kernels would autotune in this pass, beside the pass compiling the same graph,
    instead of reusing the configurations that pass chose (and this pass would race it to the cache). Should
    another torch name that step otherwise, the graph is refused once compiled, before any of it runs. A cached
    graph's kernel that finds no tuned configuration in the cache yet (the pass compiling the graph saved it before
    running it) waits for that pass to save one rather than autotune here. A graph AOTAutograd's cache holds is
    loaded whole when the pass that traced it left its node records beside the cache. With
    `cpu_kernel_ranges` (torch.profiler on the CPU), each generated C++ kernel
    opens a profiler range of its own name, so its time is an operator's and not lost between them."""

    def __init__(self, compile_mode: str, root: str, cached_only: bool = False,
                 cpu_kernel_ranges: bool = False) -> None:
        super().__init__(root)
        self.compile_mode = compile_mode
        self.cached_only = cached_only
        self.waited_for_tuning: list[str] = []  # kernels that waited for another pass's tuned configuration
        if cached_only:
            reuse_tuned_configurations(self.waited_for_tuning)
        self.patches: dict[str, object] = {}
        if compile_mode == "cudagraphs":
            self.patches["triton.cudagraphs"] = True
        if cpu_kernel_ranges:  # each generated C++ kernel records a profiler range named after it
            self.patches["cpp.enable_kernel_profile"] = True
        self.scopes: dict[str | None, str] = {}  # compile id -> digest of its Dynamo graph's module map
        self.reused_graphs = 0  # Dynamo graphs whose AOT graphs came whole from AOTAutograd's cache

    def __call__(self, gm: Any, example_inputs: Any) -> Any:
        from torch._dynamo.utils import counters

        scope = graph_scope(self.dynamo_graph(gm), self.root)
        self.scopes[compile_id()] = scope
        before = dict(counters["inductor"])
        compiled = self._compiled(gm, example_inputs, scope)
        grew = {key: counters["inductor"].get(key, 0) - before.get(key, 0) for key in CACHE_COUNTERS}
        if self.cached_only and (grew["fxgraph_cache_miss"] or grew["fxgraph_cache_bypass"]
                                 or not grew["fxgraph_cache_hit"]):
            raise NotCached(f"Inductor's FX graph cache did not hold a graph of {len(gm.graph.nodes)} nodes ({grew})")
        return compiled

    def _compiled(self, gm: Any, example_inputs: Any, scope: str) -> Any:
        """Compile `gm` with AOTAutograd's cache as configured (on by default). A miss traces through
        `inner_compile`, which records each AOT graph (forward or backward) and saves the record beside Inductor's
        cache for the Dynamo graph `scope`; AOTAutograd saves its entry.

        A hit skips AOTAutograd's tracing and Inductor's graph passes (on the H100's host, conv_block's first
        call took 2.1 s instead of 4.1 s) but hands back compiled graphs whose nodes no pass here saw: their
        module maps are the saved records. A hit with no record for one of its graphs (its entry came from
        another compile of the same Dynamo graph) traces the graph again, with the cache off, from a copy of the
        graph as Dynamo handed it over when this scope had no records (Inductor's pre-grad passes change `gm` in
        place)."""
        from torch._dynamo.utils import counters
        from torch._functorch import config as functorch_config
        from torch._inductor.compile_fx import compile_fx

        pristine = None
        if not has_records(scope):
            with suppress(Exception):  # the copy only serves a rare retrace; compiling `gm` goes on without it
                pristine = graph_copy(gm)

        def compiled_from(graph: Any, aot_cache: bool) -> Any:
            """`graph` compiled, AOTAutograd's cache as configured or off."""
            cache = nullcontext() if aot_cache else functorch_config.patch(enable_autograd_cache=False)
            with cache, codegen_refused(self.cached_only, graph):
                return compile_fx(graph, example_inputs, inner_compile=self.inner_compile,
                                  config_patches=self.patches or None)

        self.cuda_graph_trees |= uses_graph_trees(self.patches)
        hits = counters["aot_autograd"].get("autograd_cache_hit", 0)
        loaded: list[tuple[str, bool, Any]] = []
        with loaded_graphs(loaded):
            compiled = compiled_from(gm, aot_cache=True)
        if counters["aot_autograd"].get("autograd_cache_hit", 0) == hits:
            return compiled  # traced: `inner_compile` recorded each graph
        recalled = [recall_nodes(key, scope) for key, _, _ in loaded]
        if loaded and all(nodes is not None for nodes in recalled):
            for (key, backward, graph), nodes in zip(loaded, recalled, strict=True):
                self.graphs.append({
                    "compile_id": compile_id(), "kind": "backward" if backward else "forward",
                    "fx_graph_cache_key": key, "source_code": getattr(graph, "source_code", None),
                    "node_modules": nodes,
                })
            self.reused_graphs += 1
            return compiled
        # Without a copy, the graph traced now went through the pre-grad passes twice: it may differ from the cached
        # one (a pass that may only reuse the cache then stops at the miss and starts again).
        return compiled_from(gm if pristine is None else pristine, aot_cache=False)

    def inner_compile(self, gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        """Inductor's `compile_fx_inner`, recording the AOT graph it compiles and saving that record for passes
        that will load the graph from AOTAutograd's cache. A graph Inductor's cache served skipped the post-grad
        passes, so its record lacks the nodes they make: it never replaces the record of a pass that generated
        the code."""
        from torch._dynamo.utils import counters

        misses = counters["inductor"].get("fxgraph_cache_miss", 0)
        compiled = super().inner_compile(gm, example_inputs, **kwargs)
        generated = counters["inductor"].get("fxgraph_cache_miss", 0) > misses
        record = self.graphs[-1]
        key, scope = record["fx_graph_cache_key"], self.scopes.get(record["compile_id"])
        if key and scope is not None and (generated or recall_nodes(key, scope) is None):
            save_nodes(key, scope, record["node_modules"])
        return compiled


def inductor_provenance(backend: GraphRecorder, folder: Path) -> dict[str, Any]:
    """Copy every module Inductor generated in this process into `folder`/inductor_code, with the FX metadata.

    The engine reads the copies (kernel name -> original aten ops), `node_modules` (FX node -> module path)
    and `graphs` (each compiled graph's own nodes and generated code, so names that repeat across graphs keep
    their own modules) to attribute generated kernels; nothing here depends on the generated code's format.
    The copies' paths are relative to `folder`.
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
    graphs = []
    for number, graph in enumerate(backend.graphs):
        entry = {key: value for key, value in graph.items() if key != "source_code"}
        if graph.get("source_code"):
            name = f"graph_{number:03d}_{graph['kind']}.py"
            (dest / name).write_text(graph["source_code"], encoding="utf-8")
            entry["code"] = f"{INDUCTOR_CODE_DIR}/{name}"
        graphs.append(entry)
    return {"node_modules": backend.node_modules, "generated_code": copied, "graphs": graphs,
            "graph_breaks": backend.graph_breaks, "root_module": backend.root, "traced_inside": backend.inside}

