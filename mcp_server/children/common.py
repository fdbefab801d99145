"""What the children share: seeding, the workload's import and call, the environment, results written atomically.

Standard library and torch only; torch is imported inside functions, after the child has checked that it can be
imported at all.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import random
import re
import sys
import traceback
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_ERROR, EXIT_NO_TORCH = 0, 4, 3


def now() -> str:
    """UTC timestamp with seconds."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_json(path: Path, data: Any) -> None:
    """Write JSON through a temporary file of this process and a rename: processes writing the same file at once
    leave one whole copy, and a failed write leaves nothing."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:  # a full disk: say which file could not be written
        tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def traceback_tail(exc: BaseException, frames: int = 6) -> str:
    """The last frames of an exception's traceback, as text."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-frames:])


def error(kind: str, message: str, exc: BaseException | None = None, remedy: str | None = None) -> dict[str, Any]:
    """An `error` entry for a child result."""
    entry: dict[str, Any] = {"kind": kind, "message": message}
    if exc is not None:
        entry["traceback_tail"] = traceback_tail(exc)
    if remedy:
        entry["remedy"] = remedy
    return entry


def torch_available(result: dict[str, Any], out: Path) -> bool:
    """Import torch; on failure record a `no_torch` error in `out` and return False."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        result.update(status="error", error=error("no_torch", f"{sys.executable} cannot import torch: {exc}"))
        write_json(out, result)
        return False
    return True


def environment() -> dict[str, Any]:
    """Interpreter, torch and device facts, as the workload's process sees them."""
    import socket

    import torch

    cuda = torch.cuda.is_available()
    env: dict[str, Any] = {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "python_version": platform.python_version(),
        "python_executable": sys.executable,
        "hostname": socket.gethostname(),
        "cuda_available": cuda,
        "cpu_threads": torch.get_num_threads(),
        "device_name": None,
    }
    if cuda:
        props = torch.cuda.get_device_properties(0)
        env.update(
            device_name=props.name,
            sm_count=props.multi_processor_count,
            compute_capability=f"{props.major}.{props.minor}",
            total_memory_bytes=props.total_memory,
        )
    return env


def cannot_write(exc: BaseException) -> OSError | None:
    """The error, when it is a file of the run that could not be written for lack of space (ENOSPC, a quota)."""
    import errno

    return exc if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT) else None


def export_trace(profiler: Any, path: Path) -> None:
    """Export a torch.profiler trace to `path`, or raise an OSError naming it: Kineto reports a failed write
    nowhere and leaves `<path>.tmp` behind (removed here)."""
    import errno

    partial = path.with_name(path.name + ".tmp")
    path.unlink(missing_ok=True)
    profiler.export_chrome_trace(str(path))
    if path.is_file() and not partial.exists():
        return
    partial.unlink(missing_ok=True)
    full = os.statvfs(path.parent).f_bavail == 0
    raise OSError(errno.ENOSPC if full else errno.EIO, "No space left on device" if full else
                  "torch.profiler wrote no trace", str(path))


class ContractError(Exception):
    """The workload does not follow the contract (README: the workload contract)."""


CONTRACT_RETURN = ("get_model_and_input() must return (model, inputs): a torch.nn.Module and its inputs (a tuple of "
                   "positional arguments, a dict of keyword arguments, or one tensor)")


def model_and_inputs(returned: Any, module_required: bool = True) -> tuple[Any, Any]:
    """get_model_and_input()'s return as (model, inputs), or a ContractError saying what the contract wants and
    what came back. `module_required`: the model must be a torch.nn.Module (the harness walks its modules), else
    any callable (bench and validate call it)."""
    import torch

    if not isinstance(returned, (tuple, list)) or len(returned) != 2:
        raise ContractError(f"{CONTRACT_RETURN}; it returned {describe(returned)}")
    model, inputs = returned
    lazy = [name or type(model).__name__ for name, m in model.named_modules()
            if isinstance(m, torch.nn.modules.lazy.LazyModuleMixin) and m.has_uninitialized_params()
            ] if isinstance(model, torch.nn.Module) else []
    if lazy:  # their shapes come from the first call, after which every cast and compile would have to wait
        raise ContractError(f"the model's lazy modules are not initialised yet ({', '.join(lazy[:3])}): call the model "
                            "once on its inputs in get_model_and_input() before returning it")
    if isinstance(model, torch.nn.Module) or (callable(model) and not module_required):
        return model, inputs
    remedy = ": wrap it in an nn.Module whose forward calls it" if callable(model) else ""
    raise ContractError(f"{CONTRACT_RETURN}; its model is {describe(model)}, not a torch.nn.Module{remedy}")


def describe(value: Any, limit: int = 60) -> str:
    """A returned value in a few words: `None`, `a str ('abc')`, `a tuple of 3 items`, `a function (a lambda)`."""
    import inspect

    if value is None:
        return "None"
    if isinstance(value, (tuple, list, dict)):
        return f"a {type(value).__name__} of {len(value)} item{'s' if len(value) != 1 else ''}"
    if inspect.isfunction(value) or inspect.isbuiltin(value) or inspect.ismethod(value):
        name = getattr(value, "__name__", "?")
        return f"a function ({'a lambda' if name == '<lambda>' else name})"
    text = repr(value)
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    article = "an" if type(value).__name__[:1].lower() in "aeiou" else "a"
    return f"{article} {type(value).__name__} ({text})"


def load_workload(path: Path) -> Any:
    """Import a workload file as a module named after its stem (or a private alias if that name is taken by
    another file already imported). A file named like a module the process can import (`copy.py`, `torch.py`)
    would hide that module from everything imported after it: a ContractError says so."""
    path = path.resolve()
    name = path.stem
    existing = sys.modules.get(name)
    if existing is not None and Path(getattr(existing, "__file__", "") or "").resolve() == path:
        return existing
    hidden = None if name in _WORKLOADS else _module_named(name, path)
    if hidden is not None:
        raise ContractError(f"the workload's file name {path.name} is the name of the module `{name}` ({hidden}), "
                            f"which it would hide: rename the file, e.g. to {name}_model.py")
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    _WORKLOAD_DIRS.add(path.parent)
    if existing is not None:
        name = f"_operator_profiler_workload_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    _WORKLOADS.add(name)
    spec.loader.exec_module(module)
    return module


_WORKLOADS: set[str] = set()  # module names of workload files loaded here (two of one stem get an alias)
_WORKLOAD_DIRS: set[Path] = set()  # their folders: a file found there is another workload, not a module it hides


def _module_named(name: str, path: Path) -> str | None:
    """Where the module `name` comes from when it is not the workload file itself: the standard library, or
    the file or package an import of `name` finds (None when there is none)."""
    if name in sys.stdlib_module_names:
        return "standard library"
    loaded = sys.modules.get(name)
    origin = getattr(loaded, "__file__", None) if loaded is not None else None
    if origin is None and loaded is None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        origin = spec.origin if spec is not None else None
    if origin is None or Path(origin).resolve() == path or Path(origin).resolve().parent in _WORKLOAD_DIRS:
        return None
    return str(origin)


def seed_all(seed: int) -> None:
    """Seed Python, torch (and numpy when present)."""
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass


def as_call(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """get_model_and_input()'s inputs as call arguments: a tuple/list is positional, a dict keywords."""
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def map_tensors(fn: Callable[[Any], Any], obj: Any) -> Any:
    """Apply `fn` to every tensor inside nested tuples, lists and dicts; other leaves are kept."""
    import torch

    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(map_tensors(fn, v) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(map_tensors(fn, v) for v in obj)
    if isinstance(obj, dict):
        return {k: map_tensors(fn, v) for k, v in obj.items()}
    return obj


def clone(obj: Any) -> Any:
    """A detached deep copy of every tensor in `obj`."""
    return map_tensors(lambda t: t.detach().clone(), obj)


def perturb(obj: Any, seed: int) -> Any:
    """Fresh inputs of the same structure, shapes, dtypes and devices, deterministic in `seed`.

    Floating tensors get new normal values with the original's mean and standard deviation; integer tensors
    (token ids, indices) a random permutation of their own values, so they stay in range; bools new coin flips.
    An integer tensor ordered along its last dimension (EmbeddingBag offsets, positions, sequence boundaries,
    lengths sorted for packing) is structure, not data: it is kept.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)

    def fresh(t: Any) -> Any:
        t = t.detach()
        if t.numel() == 0:
            return t.clone()
        if t.is_floating_point() or t.is_complex():
            ref = t.float() if not t.is_complex() else t.real.float()
            std = float(ref.std()) if t.numel() > 1 else 1.0
            std = std if std > 0 and std == std else 1.0
            mean = float(ref.mean())
            values = torch.randn(t.shape, generator=gen) * std + mean
            return values.to(device=t.device, dtype=t.dtype)
        if t.dtype == torch.bool:
            return (torch.rand(t.shape, generator=gen) < 0.5).to(t.device)
        if _ordered(t):
            return t.clone()
        order = torch.randperm(t.numel(), generator=gen).to(t.device)
        return t.flatten()[order].reshape(t.shape).clone()

    return map_tensors(fresh, obj)


def _ordered(t: Any) -> bool:
    """Whether an integer tensor of more than one element per row is non-decreasing, or non-increasing, along
    its last dimension."""
    if t.dim() == 0 or t.shape[-1] < 2:
        return False
    step = t[..., 1:] - t[..., :-1]
    return bool((step >= 0).all()) or bool((step <= 0).all())


WRAPPED_ERROR = re.compile(r"\bgot (\w+(?:Error|Exception)\(.*\))\s*$")


def refusal(exc: BaseException, limit: int = 160) -> str:
    """An exception in one short line: its type and the first line of its message (at most `limit` characters), and
    the error inside it where Dynamo wraps one in its explanation ("... got RuntimeError('Unsupported dtype ...')")."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    first = lines[0][:limit] if lines else ""
    inner = next((found.group(1) for line in lines[1:] if (found := WRAPPED_ERROR.search(line))), None)
    return f"{type(exc).__name__}: {first}" + (f": {inner[:limit]}" if inner else "")


def varied_inputs(model: Any, inputs: Any, seeds: list[int]) -> tuple[list[Any], str | None]:
    """`perturb`ed copies of `inputs`, one per seed, that `model` runs on under `no_grad`, and why any were
    dropped (None when none was): inputs whose structure a perturbation breaks in a way `perturb` cannot see
    (indices that must be unique, a mask a row of which must stay open) leave the workload's own inputs only."""
    import torch

    kept, failure = [], None
    for seed in seeds:
        varied = perturb(inputs, seed)
        call_args, call_kwargs = as_call(varied)
        try:
            with torch.no_grad():
                model(*call_args, **call_kwargs)
        except Exception as exc:  # noqa: BLE001 - the workload's own exception, reported
            failure = refusal(exc)
            continue
        kept.append(varied)
    if failure is None:
        return kept, None
    return kept, (f"{len(seeds) - len(kept)} of {len(seeds)} perturbed input sets made the model as written raise "
                  f"({failure}): its own inputs stand in for them")


def flatten(obj: Any, prefix: str = "out") -> list[tuple[str, Any]]:
    """(path, leaf) for every leaf of nested tuples, lists, dicts and dataclasses, in order."""
    import dataclasses

    import torch

    if isinstance(obj, torch.Tensor):
        return [(prefix, obj)]
    if isinstance(obj, (tuple, list)):
        return [leaf for i, v in enumerate(obj) for leaf in flatten(v, f"{prefix}[{i}]")]
    if isinstance(obj, dict):
        return [leaf for k, v in obj.items() for leaf in flatten(v, f"{prefix}[{k!r}]")]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [leaf for f in dataclasses.fields(obj) for leaf in flatten(getattr(obj, f.name), f"{prefix}.{f.name}")]
    return [(prefix, obj)]


def tensors(obj: Any) -> list[Any]:
    """The tensors among `obj`'s leaves."""
    import torch

    return [leaf for _, leaf in flatten(obj) if isinstance(leaf, torch.Tensor)]


def device_of(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """'cuda' if the model's parameters or the inputs are on a CUDA device, else 'cpu'."""
    devices = set()
    if hasattr(model, "parameters"):
        devices |= {p.device.type for p in model.parameters()}
    devices |= {t.device.type for t in tensors((args, kwargs))}
    return "cuda" if "cuda" in devices else "cpu"


def load_same_weights(source: Any, target: Any) -> str | None:
    """Copy `source`'s state_dict into `target`; return why it could not, or None when it did."""
    if not (hasattr(source, "state_dict") and hasattr(target, "load_state_dict")):
        return "a model is not an nn.Module: the two sides' weights rely on identical seeding"
    try:
        target.load_state_dict(source.state_dict())
    except (RuntimeError, KeyError, TypeError, ValueError) as exc:
        return f"the optimized model does not accept the baseline's state_dict: {str(exc).splitlines()[0]}"
    return None


def recipe_of(module: Any) -> str | None:
    """The free recipe an optimized workload applies through its optimize(model) instead of a backend of its own
    (its module-level RECIPE), if any."""
    recipe = getattr(module, "RECIPE", None)
    return recipe if isinstance(recipe, str) and recipe and not getattr(module, "BACKEND_NAME", None) else None


def inputs_preparer(module: Any) -> Callable[[Any], Any]:
    """The optimized workload's `prepare_inputs(inputs)`: turns the baseline's inputs into the ones its optimized
    callable takes (a cast, a layout), applied once per input set before any call, as a recipe's input lines are.
    The identity when it has none."""
    prepare = getattr(module, "prepare_inputs", None)
    return prepare if callable(prepare) else (lambda inputs: inputs)


def optimized_callable(module: Any, model: Any) -> tuple[Any, str]:
    """How the optimized workload is run: its `optimize(model)`, else torch.compile with its BACKEND_NAME."""
    import torch

    optimize = getattr(module, "optimize", None)
    if callable(optimize):
        return optimize(model), "optimize()"
    backend = getattr(module, "BACKEND_NAME", None)
    if isinstance(backend, str) and backend:
        return torch.compile(model, backend=backend), f"torch.compile(backend={backend!r})"
    return model, "plain model (no optimize() nor BACKEND_NAME)"


def synchronize() -> None:
    """Wait for queued GPU work (no-op without CUDA)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_main(out: Path, run: Callable[[dict[str, Any]], None], failed: str | Callable[[str], tuple[str, str | None]],
             remedy: str | None = None) -> int:
    """A child's main: run it, write the result JSON at `out` whatever happens, return the exit code.

    `failed` names what failed in the error message ("the bench"), or maps the phase that failed to that name and
    its remedy.
    """
    out = out.resolve()
    result: dict[str, Any] = {"status": "running", "phase": "import", "started_at": now(), "warnings": []}
    if not torch_available(result, out):
        return EXIT_NO_TORCH
    result["environment"] = environment()
    code = EXIT_OK
    try:
        run(result)
        result["status"] = "ok"
    except BaseException as exc:  # noqa: BLE001 - the workload's failure is reported, not re-raised
        if callable(failed):
            failed, remedy = failed(result["phase"])
        print(f"{failed} failed during {result['phase']}:", file=sys.stderr)  # the whole traceback in the log
        traceback.print_exception(type(exc), exc, exc.__traceback__)
        message = f"{failed} failed during {result['phase']}: {refusal(exc, 300)}"
        result.update(status="error", error=error("workload_raised", message, exc, remedy))
        code = EXIT_ERROR
    result["finished_at"] = now()
    write_json(out, result)
    return code
