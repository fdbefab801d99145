"""Inductor provenance: which aten ops and nn.Modules each generated kernel came from.

The harness copies the code Inductor generated into `<pass>/inductor_code/` and records each FX graph
node's `nn_module_stack` in `inductor_provenance.json`; this module reads both. Inductor writes, above
each kernel definition (and above each extern-kernel call), a comment of the form
`# Topologically Sorted Source Nodes: [conv2d, batch_norm], Original ATen: [aten.convolution, ...]`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from plugins.nvtx_names import GRAPH_CALL_PREFIX

_ORIGIN = re.compile(r"Source Nodes: \[([^\]]*)\], Original ATen: \[([^\]]*)\]")
_KERNEL_DEF = re.compile(r"^(\w+) = async_compile\.\w+\(")
_EXTERN_CALL = re.compile(r"^\s+(?:\w+ = )?(?:extern_kernels\.(\w+)|torch\.ops\.(\w+)\.(\w+)\.\w+)\(")
_TRITON_RUN = re.compile(r"^\s+(\w+)\.run\(")
_STREAM_LINE = re.compile(r"^\s+stream\d+ = get_raw_stream\(")


class KernelOrigin(BaseModel):
    """Where one generated kernel came from."""

    kernel_name: str
    aten_ops: list[str] = Field(default_factory=list, description="e.g. ['aten::convolution', 'aten::relu']")
    source_nodes: list[str] = Field(default_factory=list)
    module_paths: list[str] = Field(default_factory=list)
    call_site: str | None = Field(default=None, description="The user's line of its last source node with one.")

    @property
    def module_path(self) -> str | None:
        """The deepest module path shared by every source node (None when unknown)."""
        return common_module_path(self.module_paths)


def common_module_path(paths: list[str]) -> str | None:
    """The deepest module path shared by all `paths`; all of them, comma-joined, when they share none."""
    if not paths:
        return None
    parts = [p.split(".") for p in paths]
    common: list[str] = []
    for level in zip(*parts, strict=False):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return ".".join(common) if common else ",".join(paths)


def _aten_name(dotted: str) -> str:
    """`aten._native_batch_norm_legit_no_training` -> `aten::_native_batch_norm_legit_no_training`."""
    namespace, _, op = dotted.partition(".")
    return f"{namespace}::{op}" if op else dotted


def parse_generated_code(source: str) -> dict[str, tuple[list[str], list[str]]]:
    """Kernel name -> (source FX node names, original aten ops) from one generated wrapper module."""
    kernels: dict[str, tuple[list[str], list[str]]] = {}
    pending: tuple[list[str], list[str]] | None = None
    for line in source.splitlines():
        origin = _ORIGIN.search(line)
        if origin:
            nodes = [n.strip() for n in origin.group(1).split(",") if n.strip()]
            atens = [_aten_name(a.strip()) for a in origin.group(2).split(",") if a.strip()]
            pending = (nodes, atens)
            continue
        match = _KERNEL_DEF.match(line)
        if match:
            if pending is not None:
                kernels[match.group(1)] = pending
            pending = None
        elif pending is not None and line.strip() and not line.lstrip().startswith("#"):
            pending = None
    return kernels


class ExternCall(BaseModel):
    """One call of a library kernel (cuBLAS, cuDNN...) or fallback op in a generated graph's call()."""

    operator_name: str = Field(description="The aten op of an extern call, the kernel name of a generated one.")
    source_nodes: list[str] = Field(default_factory=list)
    module_path: str | None = None
    kind: str = Field(default="extern", description="'extern' (a library or fallback op) or 'triton'.")
    call_site: str | None = None


def parse_extern_calls(source: str) -> list[ExternCall]:
    """The launches of a generated module's call(), in call order: extern/fallback operator calls, and
    generated kernels' `.run(` calls (kind 'triton', named by the kernel), each with its comment's nodes."""
    calls: list[ExternCall] = []
    nodes: list[str] = []
    for line in source.splitlines():
        origin = _ORIGIN.search(line)
        if origin:
            nodes = [n.strip() for n in origin.group(1).split(",") if n.strip()]
            continue
        match = _EXTERN_CALL.match(line)
        run = None if match else _TRITON_RUN.match(line)
        if match:
            name = f"aten::{match.group(1)}" if match.group(1) else f"{match.group(2)}::{match.group(3)}"
            calls.append(ExternCall(operator_name=name, source_nodes=nodes))
            nodes = []
        elif run:
            calls.append(ExternCall(operator_name=run.group(1), source_nodes=nodes, kind="triton"))
            nodes = []
        elif line.strip() and not line.lstrip().startswith("#") and not _STREAM_LINE.match(line):
            nodes = []
    return calls


# An extern call's comment lists every FX node fused around it; the module that owns the call is the one of
# this type (e.g. the convolution's Conv2d, not the BatchNorm folded into it or the ReLU after it).
_OWNER_TYPES = {
    "convolution": ("Conv",), "_convolution": ("Conv",), "mm": ("Linear",), "addmm": ("Linear",),
    "linear": ("Linear",), "_scaled_dot_product_flash_attention": ("Attention",),
    "_scaled_dot_product_efficient_attention": ("Attention",), "lstm": ("LSTM",), "embedding": ("Embedding",),
}


def extern_module_path(call: ExternCall, node_modules: dict[str, dict[str, str]]) -> str | None:
    """The module of the FX node that owns an extern call: one of the op's own module type when present,
    else the last source node with a module (the call's own node comes last in topological order)."""
    known = [n for n in call.source_nodes if n in node_modules]
    if not known:
        return None
    owners = _OWNER_TYPES.get(call.operator_name.split("::", 1)[-1], ())
    for node in reversed(known):
        if any(t in node_modules[node].get("module_type", "") for t in owners):
            return node_modules[node]["module_path"]
    return node_modules[known[-1]]["module_path"]


class GraphProvenance(BaseModel):
    """One compiled graph's own kernels and launch sequence: names repeat across graphs, modules do not."""

    compile_id: str | None = None
    kind: str = Field(default="forward", description="'forward' or 'backward'.")
    kernels: dict[str, KernelOrigin] = Field(default_factory=dict)
    extern_calls: list[ExternCall] = Field(default_factory=list)


class Provenance(BaseModel):
    """Everything the harness gathered about Inductor's generated code in one pass."""

    kernels: dict[str, KernelOrigin] = Field(default_factory=dict)
    extern_calls: list[list[ExternCall]] = Field(default_factory=list, description="Per generated module.")
    graphs: dict[str, GraphProvenance] = Field(
        default_factory=dict, description="Per compiled graph, by the FX-graph-cache key its runtime range names."
    )
    graph_breaks: list[dict[str, str]] = Field(default_factory=list)
    root_module: str | None = None
    traced_inside: str = Field(default="", description="The module, under the model, whose forward the graphs traced "
                               "(a DDP wrapper's `module`); empty: the model's own.")

    def graph(self, call_range: str | None) -> GraphProvenance | None:
        """The graph a `## Call CompiledFxGraph <key> ##` range ran, when the capture recorded it."""
        key = graph_key(call_range)
        return self.graphs.get(key) if key and self.graphs else None


def graph_key(call_range: str | None) -> str | None:
    """The FX-graph-cache key a `## Call CompiledFxGraph <key> ##` range names (None: no range, or no key)."""
    if not call_range:
        return None
    key = call_range.removeprefix(GRAPH_CALL_PREFIX).strip().split(" ", 1)[0]
    return key if key and key != "None" and key != "##" else None


def _site(nodes: list[str], node_modules: dict[str, dict[str, str]]) -> str | None:
    """The call site of the last node that has one (a fused kernel's output comes last)."""
    return next((node_modules[n]["site"] for n in reversed(nodes) if node_modules.get(n, {}).get("site")), None)


def _module_paths(nodes: list[str], node_modules: dict[str, dict[str, str]]) -> list[str]:
    return sorted({node_modules[n]["module_path"] for n in nodes if node_modules.get(n, {}).get("module_path")})


def _read_module(source: str, node_modules: dict[str, dict[str, str]]) -> tuple[dict[str, KernelOrigin],
                                                                               list[ExternCall]]:
    """The kernel origins and the launch sequence of one generated module, resolved by `node_modules`."""
    calls = parse_extern_calls(source)
    for call in calls:
        if call.kind == "triton":
            call.module_path = common_module_path(_module_paths(call.source_nodes, node_modules))
        else:
            call.module_path = extern_module_path(call, node_modules)
        call.call_site = _site(call.source_nodes, node_modules)
    origins = {
        name: KernelOrigin(kernel_name=name, aten_ops=atens, source_nodes=nodes,
                           module_paths=_module_paths(nodes, node_modules), call_site=_site(nodes, node_modules))
        for name, (nodes, atens) in parse_generated_code(source).items()
    }
    return origins, calls


def _graphs(data: dict[str, Any], folder: Path) -> dict[str, GraphProvenance]:
    """Each Inductor graph's provenance, by FX-graph-cache key, its nodes resolved by its own map and by the Dynamo
    graph it was compiled from (the generated code names nodes of either)."""
    entries = data.get("graphs", [])
    # A compile id's Dynamo graph, or the pieces Dynamo's DDP optimizer splits it into (one per gradient bucket, each
    # compiled alone, whose node names repeat from piece to piece): a forward graph is compiled right after its piece;
    # a backward graph (compiled later, in another order) resolves its nodes by its own map first
    latest: dict[Any, dict[str, dict[str, str]]] = {}
    every: dict[Any, dict[str, dict[str, str]]] = {}
    found: dict[str, GraphProvenance] = {}
    for graph in entries:
        compiled = graph.get("compile_id")
        if graph.get("kind") == "dynamo":
            latest[compiled] = graph.get("node_modules", {})
            every.setdefault(compiled, {}).update(latest[compiled])
            continue
        key, code = graph.get("fx_graph_cache_key"), graph.get("code")
        if not key or not code or not (folder / code).is_file():
            continue
        own: dict[str, dict[str, str]] = graph.get("node_modules", {})
        forward = graph.get("kind") == "forward"
        outer = (latest if forward else every).get(compiled, {})
        nodes = {**own, **outer} if forward else {**outer, **own}
        origins, calls = _read_module((folder / code).read_text(encoding="utf-8"), nodes)
        found[key] = GraphProvenance(compile_id=graph.get("compile_id"), kind=graph.get("kind", "forward"),
                                     kernels=origins, extern_calls=calls)
    return found


def load_provenance(index: Path) -> Provenance:
    """Origins of every kernel and extern call Inductor generated in a pass, from its provenance file (the
    generated code's copies are listed relative to the file's folder); empty when the pass was not compiled."""
    if not index.is_file():
        return Provenance()
    data = json.loads(index.read_text(encoding="utf-8"))
    node_modules: dict[str, dict[str, str]] = data.get("node_modules", {})
    origins: dict[str, KernelOrigin] = {}
    externs: list[list[ExternCall]] = []
    for rel in data.get("generated_code", []):
        code = index.parent / rel
        if not code.is_file():
            continue
        found, calls = _read_module(code.read_text(encoding="utf-8"), node_modules)
        if calls:
            externs.append(calls)
        for name, origin in found.items():
            known = origins.get(name)
            if known is None:
                origins[name] = origin
            else:
                known.aten_ops = sorted(set(known.aten_ops) | set(origin.aten_ops))
                known.module_paths = sorted(set(known.module_paths) | set(origin.module_paths))
    return Provenance(kernels=origins, extern_calls=externs, graphs=_graphs(data, index.parent),
                      graph_breaks=data.get("graph_breaks", []), root_module=data.get("root_module"),
                      traced_inside=data.get("traced_inside") or "")
