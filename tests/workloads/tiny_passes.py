"""FX passes the test workloads' backends apply (real graph rewrites on Dynamo's GraphModule)."""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

MUL_TARGETS = (operator.mul, torch.mul)
ADD_TARGETS = (operator.add, torch.add)


def _is_tensor(node: Any) -> bool:
    return isinstance(node, fx.Node) and isinstance(node.meta.get("example_value"), torch.Tensor)


def relu_to_functional(gm: fx.GraphModule) -> int:
    """Replace `torch.relu` calls by `torch.nn.functional.relu` (numerically identical); return how many."""
    count = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.relu:
            node.target = torch.nn.functional.relu
            count += 1
    gm.recompile()
    return count


def fuse_mul_add(gm: fx.GraphModule) -> int:
    """Rewrite `a * b + c` (tensors, the product used once) as `torch.addcmul(c, a, b)`; return how many."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in ADD_TARGETS or node.kwargs or len(node.args) != 2:
            continue
        left, right = node.args
        for product, other in ((left, right), (right, left)):
            if (
                isinstance(product, fx.Node) and product.op == "call_function" and product.target in MUL_TARGETS
                and len(product.users) == 1 and not product.kwargs and len(product.args) == 2
                and all(_is_tensor(a) for a in product.args) and _is_tensor(other)
            ):
                with gm.graph.inserting_before(node):
                    fused = gm.graph.call_function(torch.addcmul, (other, *product.args))
                fused.meta.update(node.meta)
                node.replace_all_uses_with(fused)
                gm.graph.erase_node(node)
                gm.graph.erase_node(product)
                count += 1
                break
    gm.graph.lint()
    gm.recompile()
    return count


def scale_outputs(gm: fx.GraphModule, factor: float) -> int:
    """Multiply every tensor the graph returns by `factor` (a deliberately wrong pass); return how many."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    values = output.args[0]
    flat = list(values) if isinstance(values, (tuple, list)) else [values]
    scaled = []
    with gm.graph.inserting_before(output):
        for value in flat:
            is_node = isinstance(value, fx.Node)
            scaled.append(gm.graph.call_function(operator.mul, (value, factor)) if is_node else value)
    output.args = (type(values)(scaled) if isinstance(values, (tuple, list)) else scaled[0],)
    gm.recompile()
    return len(flat)


def mutate_inputs(gm: fx.GraphModule, example_inputs: list[Any]) -> int:
    """After everything is computed, clamp the user inputs (not parameters) in place: a deliberately wrong pass."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    output = next(n for n in gm.graph.nodes if n.op == "output")
    count = 0
    with gm.graph.inserting_before(output):
        for node, example in zip(placeholders, example_inputs, strict=False):
            if isinstance(example, torch.Tensor) and not isinstance(example, torch.nn.Parameter):
                gm.graph.call_method("relu_", (node,))
                count += 1
    gm.recompile()
    return count
