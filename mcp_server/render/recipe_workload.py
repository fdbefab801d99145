"""The tier's winner of the free frontier as an optimized workload: `<name>_optimized.py`, plain code in optimize().

The file follows the optimized-workload contract with `RECIPE` in place of a backend of its own (validate skips the
backend checks and says why): it imports the baseline's `get_model_and_input` from the baseline's folder, and its
`optimize(model)` applies the recipe exactly as `recipes` measured it, plus, where CUDA graphs replay the calls,
a copy of each output (a replay overwrites the previous call's outputs, which validate's output_caching check and
any caller keeping them would see). The copy is not optional: CUDA graph trees make a read of an overwritten output
raise only for the outputs of a warm-up or recording call; a steady-state replay overwrites the previous replay's
outputs in silence (`torch._inductor.cudagraph_trees`: ending an execution deallocates nothing; validate caught it on
the H200, docs/measurements/h200_unseen_workloads.json `sixteenth_stop`). Where the copies cost (several outputs, a
host-bound call), the whole call replayed from one CUDA graph may go beyond the winner
(`knowledge/fx_patterns/whole_forward_graph.md`; measured 1.116× on the T5 encoder, 1.273× on the multi-task CNN).
The recipe's input conversions (a cast, channels_last) go in `prepare_inputs`, which validate, bench and profiling
apply once per input set before the calls, as `recipes` did before its timed calls: the optimized workload is timed
as its recipe was.
"""

from __future__ import annotations

import keyword
from pathlib import Path

from mcp_server.children.contract import GRAPH_MODES, MEMORY_FORMATS, half_dtype_name, recipe_parts
from mcp_server.proof.recipe_plan import input_casts
from mcp_server.schema.io import write_text_atomic
from mcp_server.schema.recipes import RecipesReport, Winner


def prepare_inputs_source(recipe: str) -> list[str]:
    """`prepare_inputs(inputs)`: the recipe's input conversions, applied once per input set before any call, as
    `recipes` applied them before its timed calls; empty when the recipe converts no input."""
    casts = input_casts(recipe)
    if not casts:
        return []
    lines = ["", "", "def prepare_inputs(inputs: tuple[Any, ...]) -> tuple[Any, ...]:",
             f'    """The baseline\'s inputs as {recipe} takes them, converted once before the calls (not in '
             'each call)."""']
    for cast in casts:  # every tensor, however nested in tuples, lists and dicts, as `recipes` converted them
        lines.append(f"    inputs = tree_map(lambda x: ({cast}) if isinstance(x, torch.Tensor) else x, inputs)")
    return lines + ["    return inputs"]


def optimize_body(recipe: str, device: str) -> list[str]:
    """The lines of `optimize(model)` that apply `recipe` (indented four spaces), ending with `return run`; its
    inputs come converted by `prepare_inputs` (`prepare_inputs_source`)."""
    mode, precision, layout, cudnn_benchmark = recipe_parts(recipe)
    lines = []
    if device == "cuda":
        tf32 = "True" if precision == "tf32" else "False"
        lines += [f"torch.backends.cuda.matmul.allow_tf32 = {tf32}", f"torch.backends.cudnn.allow_tf32 = {tf32}"]
    if cudnn_benchmark:
        lines.append("torch.backends.cudnn.benchmark = True")
    if precision.endswith("-cast"):
        lines.append(f"model = model.to({half_dtype_name(precision)})")
    if layout:
        lines.append(f"model = model.to(memory_format=torch.{MEMORY_FORMATS[layout][0]})")
    if mode == "eager":
        lines.append("compiled = model")
    elif mode == "compile":
        lines.append("compiled = torch.compile(model)")
    else:
        lines.append(f'compiled = torch.compile(model, mode="{mode}")')
    lines += ["", "def run(*args: Any, **kwargs: Any) -> Any:"]  # the inputs positional, or by keyword (a dict)
    call = "compiled(*args, **kwargs)"
    if mode in GRAPH_MODES:
        lines.append("    torch.compiler.cudagraph_mark_step_begin()")
    if precision.endswith("-autocast"):
        lines += [f'    with torch.autocast("{device}", dtype={half_dtype_name(precision)}):', f"        out = {call}"]
    else:
        lines.append(f"    out = {call}")
    if mode in GRAPH_MODES:
        lines.append("    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)  # replays "
                     "overwrite outputs")
    else:
        lines.append("    return out")
    lines += ["", "return run"]
    return ["    " + line if line else "" for line in lines]


def _baseline_import(workload: Path) -> list[str]:
    """The lines that import the baseline's get_model_and_input: `from <name> import ...`, or, when the file's name
    is no Python identifier (`my-model.py`), the file loaded by its path."""
    name = workload.stem
    if name.isidentifier() and not keyword.iskeyword(name):
        return [f"from {name} import get_model_and_input  # noqa: E402,F401 - the baseline's model and inputs"]
    return [
        "import importlib.util  # noqa: E402 - the baseline's file name is no module name: loaded by its path",
        "",
        f"_spec = importlib.util.spec_from_file_location(\"baseline_workload\", {str(workload.resolve())!r})",
        "_baseline = importlib.util.module_from_spec(_spec)",
        "_spec.loader.exec_module(_baseline)",
        "get_model_and_input = _baseline.get_model_and_input  # the baseline's model and inputs",
    ]


def recipe_workload(workload: Path, winner: Winner, report: RecipesReport, recipes_path: Path) -> str:
    """The source of `<name>_optimized.py` applying `winner` to `workload`'s model."""
    name = workload.stem
    mode = recipe_parts(winner.recipe)[0]
    device = report.device_name or report.device_type
    seeds = ", ".join(map(str, report.seeds))
    error = f"{winner.max_rel_error:.2g}" if winner.max_rel_error is not None else "none measured"
    speed = f", {winner.speedup_vs_reference:.2f}x {report.reference_label}" if winner.speedup_vs_reference else ""
    graphs = mode in GRAPH_MODES
    head = [
        f'"""{name}, optimized: {winner.recipe}, the {winner.tier} tier\'s winner of the free frontier by '
        f"{winner.metric.replace('_', '-')}.",
        "",
        f"Measured by `operator-profiler recipes` on {device} (torch {report.torch_version}, {recipes_path}): "
        f"{winner.time_ns / 1e6:.3f} ms per call{speed}; largest relative error against {report.reference_label} "
        f"{error} over seeds {seeds}. optimize(model) applies it as a user would paste it"
        + ("; each output is copied, since CUDA graph replays overwrite them." if graphs else ".") + '\n"""',
        "",
        "from __future__ import annotations",
        "",
        "import sys",
        "from typing import Any",
        "",
        "import torch",
    ]
    if graphs or input_casts(winner.recipe):
        head.append("from torch.utils._pytree import tree_map")
    head += [
        "",
        f"sys.path.insert(0, {str(workload.resolve().parent)!r})  # the baseline's folder: its workload and imports",
        *_baseline_import(workload),
        "",
        f'RECIPE = "{winner.recipe}"',
        "",
        "",
        "def optimize(model: torch.nn.Module) -> Any:",
    ]
    takes = ("inputs converted once by prepare_inputs" if input_casts(winner.recipe) else "the baseline's inputs")
    head.append(f'    """{winner.recipe} applied to `model`: a callable taking {takes}."""')
    body = optimize_body(winner.recipe, report.device_type) + prepare_inputs_source(winner.recipe)
    return "\n".join(head + body) + "\n"


def write_recipe_workload(workload: Path, winner: Winner, report: RecipesReport, recipes_path: Path,
                          out_dir: Path) -> Path:
    """Write `out_dir/<name>_optimized.py` (atomically); its path."""
    path = Path(out_dir) / f"{Path(workload).stem}_optimized.py"
    write_text_atomic(path, recipe_workload(Path(workload), winner, report, recipes_path))
    return path
