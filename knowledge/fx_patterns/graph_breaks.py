"""Find and remove TorchDynamo graph breaks (torch.compile configuration and source edits, IR level: dynamo).

`graph_breaks(model, *inputs)` compiles `model` once with a recording backend and returns how many graphs
Dynamo made and each break's reason and `file:line` (the same facts `capture_metadata.graph_breaks` records
during a capture). `fewer_breaks()` is a context manager with the Dynamo settings that remove the two most
common breaks without touching the model: a scalar read with `.item()` stays in the graph
(`capture_scalar_outputs`), and `print`/logging calls are moved after the graph (`reorderable_logging_functions`).

When to apply: a compiled model with `graph_breaks` in its profile; the window shows kernels launched between
compiled graphs, idle GPU time at each graph boundary and host syncs (`.item()`, `.tolist()`, `nonzero`).

Trigger metrics (profile.json / analysis.json): `capture_metadata.graph_breaks` non-empty; several distinct
`compiled_graph` values per forward; GPU idle gaps before the first kernel of each graph.

Expected gain: each break costs a graph boundary (guard checks, Python between graphs, a lost fusion across the
boundary) and, for a data-dependent read, a host-device sync: a few to tens of microseconds per break per
step, more when the break splits a fusible chain. Removing all of them also lets CUDA graphs
(`mode="reduce-overhead"`) cover the whole forward. Self-contained (torch only).

Usual fixes, in the order to try them:
1. `.item()` / `.tolist()` used as a number: keep it a tensor (`x / (1 + x.abs().mean())`), or
   `torch._dynamo.config.capture_scalar_outputs = True`.
2. `print` / `logging`: remove it from `forward`, or list it in `torch._dynamo.config.reorderable_logging_functions`.
3. Data-dependent Python control flow: `torch.where`, or `torch.cond` for real branches.
4. Unsupported third-party calls: `torch.compiler.disable` on the smallest function that holds them.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


def graph_breaks(model: Any, *inputs: Any) -> tuple[int, list[dict[str, str]]]:
    """(number of graphs Dynamo made, [{reason, location}] of every break) for one call of `model`."""
    graphs: list[Any] = []

    def record(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=record)(*inputs)
    breaks = []
    for gm in graphs:
        reason = getattr(gm, "compile_subgraph_reason", None)
        if reason is not None and reason.graph_break:
            frame = reason.user_stack[-1] if reason.user_stack else None
            breaks.append({"reason": str(reason.reason).splitlines()[0],
                           "location": f"{frame.filename}:{frame.lineno}" if frame else "unknown"})
    return len(graphs), breaks


@contextmanager
def fewer_breaks() -> Iterator[None]:
    """Dynamo settings that keep `.item()` in the graph and move `print` after it (restored on exit)."""
    config = torch._dynamo.config
    with config.patch(capture_scalar_outputs=True,
                      reorderable_logging_functions=set(config.reorderable_logging_functions) | {builtins.print}):
        yield
