"""The bytecode precompile beside a run's passes: which sources, in which order, and that the passes' imports then
load the compiled files (checked with `python -v`, which names the bytecode each module came from)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from mcp_server.children import precompile as child
from mcp_server.process.bytecode import (
    OPT_OUT,
    WORKERS_ENV,
    cache_dir,
    interpreter_env,
    precompile_notes,
    precompile_workers,
    precompiling,
)
from mcp_server.process.child_scripts import child_command

TREE = {  # a fake torch, its closure and a package `vision`, with import statements to follow
    "torch/__init__.py": "from torch import nn\nimport torch._dynamo.eval_frame as _ef\nfrom . import _utils\n",
    "torch/_utils.py": "X = 1\n",
    "torch/nn/__init__.py": "from .modules import conv\n",
    "torch/nn/modules/__init__.py": "",
    "torch/nn/modules/conv.py": "from ..._utils import X\n",
    "torch/_dynamo/__init__.py": "",
    "torch/_dynamo/eval_frame.py": "import sympy\n",
    "torch/lazy.py": "Y = 2\n",  # no import statement names it
    "sympy/__init__.py": "from sympy import core\n",
    "sympy/core.py": "",
    "mpmath/__init__.py": "",
    "numpy/__init__.py": "",
    "typing_extensions.py": "",
    "vision/__init__.py": "",
    "vision/models/__init__.py": "from .resnet import *\n",
    "vision/models/resnet.py": "import torch.nn\n",
}
SKIPPED = {"torch/tests/test_big.py": "", "torch/testing/__init__.py": "", "torch/testing/_internal/big.py": ""}


def _site(tmp_path: Path) -> tuple[str, list[Path]]:
    """An interpreter (a wrapper of this one) whose torch, its closure and `vision` are the small packages of
    TREE in tmp_path, without bytecode; the sources the precompile compiles (all but the skipped folders')."""
    site = tmp_path / "site"
    for rel, text in {**TREE, **SKIPPED}.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper), [site / rel for rel in TREE] + [site / "torch/testing/__init__.py"]


def _workload(tmp_path: Path) -> Path:
    (tmp_path / "helper.py").write_text("")
    workload = tmp_path / "workload.py"
    workload.write_text("import os\nimport torch.nn\nimport vision.models.resnet\nfrom helper import x\n"
                        "def get_model_and_input(): ...\n")
    return workload


def _forbidding(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.delenv(OPT_OUT, raising=False)


def _code_objects(python: str, modules: str) -> set[str]:
    """The files `python -v` says the code objects of the site's modules came from, importing `modules`."""
    proc = subprocess.run([python, "-v", "-c", f"import {modules}"], capture_output=True, text=True, check=True,
                          env=interpreter_env(python))
    found = {line.removeprefix("# code object from ").strip("'") for line in proc.stderr.splitlines()
             if line.startswith("# code object from ")}
    return {f for f in found if "/site/" in f}


def test_the_workload_imports_packages_outside_the_standard_library_and_its_folder(tmp_path):
    assert child.workload_packages(_workload(tmp_path)) == ["torch", "vision"]


def test_import_statements_name_modules_and_their_parents_relative_ones_resolved():
    source = "import os.path, a.b as c\nfrom ..x import y as z, w\nfrom . import (\n  q)\n  from a.b import *\n"
    assert child.imports_of("a.b.c", False, source) == ["os", "os.path", "a", "a.b", "a.x", "a.x.y", "a.x.w"]
    assert child.imports_of("a.b", True, "from . import m\nfrom .. import n\n") == ["a", "a.b", "a.b.m", "a.n"]
    assert child.imports_of("a", False, "from . import m\n") == []  # beyond the top-level package


def test_imports_in_definitions_and_type_checking_blocks_at_any_depth_are_not_followed():
    source = ("import a\nif X:\n    import b\n    def f():\n        import c\n    class K:\n        import d\n"
              "else:\n    from typing import TYPE_CHECKING\n    if TYPE_CHECKING:\n        import e\n    import g\n"
              "@decorated\ndef h(\n    x,\n) -> None:\n    # a comment\n    import i\nimport j\n")
    assert child.imports_of("m", False, source) == ["a", "b", "typing", "typing.TYPE_CHECKING", "g", "j"]


def test_sources_compile_in_import_order_then_the_rest_without_test_folders(tmp_path, monkeypatch):
    _, made = _site(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "prefix"))
    index = child.SourceIndex.of(["torch", "vision", "not_installed"])
    assert index.roots == ["torch", "vision"]
    order = child.precompile(index, ["torch", "vision"], workers=1, batch_size=1).order
    # the order `import torch; import vision` loads them in: each import statement followed to its end first
    assert order[:10] == ["torch", "torch.nn", "torch.nn.modules", "torch.nn.modules.conv", "torch._utils",
                          "torch._dynamo", "torch._dynamo.eval_frame", "sympy", "sympy.core", "vision"]
    assert order.index("torch.nn.modules.conv") < order.index("torch.lazy")  # reached first, though deeper
    assert order.index("vision") < order.index("vision.models"), "no import reaches vision.models: the rest, last"
    # every module of the packages asked for, test folders left out, and what their imports reached elsewhere
    assert sorted(order) == sorted([*index.rest, "sympy", "sympy.core"])
    assert {index.modules[n] for n in order} == {p for p in made if p.parts[len(tmp_path.parts) + 1] in
                                                  ("torch", "vision", "sympy")}
    assert "torch.testing._internal.big" in index.modules and "torch.tests.test_big" in index.modules


def test_compiled_bytecode_is_found_under_the_prefix_and_goes_stale_with_its_source(tmp_path, monkeypatch):
    _, made = _site(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "prefix"))
    index = child.SourceIndex.of(child.TORCH_CLOSURE)
    assert "typing_extensions" in sys.modules  # imported here, yet found where the site's interpreter finds it
    assert index.modules["typing_extensions"].parent == tmp_path / "site"
    assert not any(child.compiled(p) for p in index.modules.values())
    result = child.precompile(index, ["torch"], workers=2)
    assert result.done == len(result.order) == len(index.rest) == len([p for p in made if "vision" not in p.parts])
    assert all(child.compiled(index.modules[n]) for n in index.rest)
    assert child.precompile(index, ["torch"], workers=2).order == []
    assert not list((tmp_path / "site").rglob("__pycache__"))  # written under the prefix only
    changed = index.modules["torch.lazy"]
    changed.write_text(changed.read_text() + "MORE = 1\n")
    os.utime(changed, (time.time() + 5, time.time() + 5))
    assert child.precompile(index, ["torch"], workers=2).order == ["torch.lazy"]


def test_precompiled_bytecode_is_what_the_passes_then_load(tmp_path, monkeypatch):
    python, made = _site(tmp_path)
    _forbidding(monkeypatch, tmp_path)
    log = tmp_path / "run" / "bytecode.log"
    with precompiling(python, _workload(tmp_path), log, compiling=False, workers=2) as job:
        assert job is not None and job.wait(60)
    summary = re.fullmatch(r"precompiled (\d+) of (\d+) sources in [0-9.]+ s, 2 workers, into (.+)",
                           job.summary() or "")
    assert summary is not None and summary[1] == summary[2] and summary[3] == str(cache_dir())
    assert int(summary[1]) > len(made)  # the harness's own modules and the standard library's they import too
    assert precompile_notes(job, tmp_path / "run", "map's ncu pass") == [
        f"bytecode: {summary[0]}, beside map's ncu pass (no bytecode was cached; see bytecode.log)"]
    imported = [tmp_path / "site" / rel for rel in TREE if not rel.startswith(("torch/lazy", "mpmath", "numpy",
                                                                                 "typing_extensions"))]
    monkeypatch.setattr(sys, "pycache_prefix", str(cache_dir()))
    assert _code_objects(python, "torch.nn.modules.conv, vision.models.resnet") == {
        importlib.util.cache_from_source(str(p)) for p in imported}
    assert Path(importlib.util.cache_from_source(str(child.HERE / "harness.py"))).is_file()

    again = tmp_path / "run" / "again.log"
    with precompiling(python, _workload(tmp_path), again, compiling=False, workers=2) as job:
        assert job is not None and job.wait(60)
    assert job.summary() is None and precompile_notes(job, tmp_path / "run") == []
    assert "nothing to compile" in again.read_text()


def test_a_cache_being_filled_drops_the_bytecode_of_sources_now_gone(tmp_path, monkeypatch):
    python, _ = _site(tmp_path)
    _forbidding(monkeypatch, tmp_path)
    workload = _workload(tmp_path)
    with precompiling(python, workload, tmp_path / "first.log", compiling=False, workers=2) as job:
        assert job is not None and job.wait(60)
    site = tmp_path / "site"
    monkeypatch.setattr(sys, "pycache_prefix", str(cache_dir()))
    kept, gone = site / "torch" / "nn" / "modules" / "conv.py", site / "vision" / "models" / "resnet.py"
    bytecode = {path: Path(importlib.util.cache_from_source(str(path))) for path in (kept, gone)}
    assert all(file.is_file() for file in bytecode.values())
    # `vision` uninstalled, torch upgraded: its __init__ changed, so the next run compiles again
    for path in sorted((site / "vision").rglob("*.py"), reverse=True):
        path.unlink()
    (site / "torch" / "__init__.py").write_text(TREE["torch/__init__.py"] + "VERSION = 2\n")
    workload.write_text(workload.read_text().replace("import vision.models.resnet\n", ""))
    log = tmp_path / "second.log"
    with precompiling(python, workload, log, compiling=False, workers=2) as job:
        assert job is not None and job.wait(60)
    removed = re.search(r"^removed (\d+) bytecode files whose source is gone", log.read_text(), re.MULTILINE)
    assert removed is not None and int(removed[1]) == 3  # vision's __init__, models/__init__ and models/resnet
    assert bytecode[kept].is_file() and not bytecode[gone].exists()
    assert not bytecode[gone].parent.exists()  # the folders left empty went too
    assert child.compiled(site / "torch" / "__init__.py")


def test_bytecode_a_pass_wrote_since_the_run_started_does_not_count_as_cached(tmp_path, monkeypatch):
    python, _ = _site(tmp_path)
    _forbidding(monkeypatch, tmp_path)
    workload = _workload(tmp_path)
    # a pass of this run imported torch first: its __init__ has bytecode, written after the run started
    subprocess.run([python, "-c", "import torch"], check=True, env=interpreter_env(python))
    monkeypatch.setattr(sys, "pycache_prefix", str(cache_dir()))
    torch_init = tmp_path / "site" / "torch" / "__init__.py"
    assert child.compiled(torch_init)
    written = os.stat(importlib.util.cache_from_source(str(torch_init))).st_mtime
    assert not child.cached_before(torch_init, written - 1.0)
    assert child.cached_before(torch_init, written + 1.0) and child.cached_before(torch_init, None)

    def precompile_since(since: float) -> str:
        command = child_command(python, "precompile", "--workload", str(workload), "--workers", "1", "--since",
                                str(since))
        return subprocess.run(command, capture_output=True, text=True, env=interpreter_env(python),
                              check=True).stdout

    assert precompile_since(written - 1.0).splitlines()[-1].startswith("precompiled ")
    assert "nothing to compile" in precompile_since(time.time())


def test_no_precompile_without_spare_cpus_or_where_bytecode_may_be_written(tmp_path, monkeypatch):
    python, _ = _site(tmp_path)
    _forbidding(monkeypatch, tmp_path)
    with precompiling(python, _workload(tmp_path), tmp_path / "a.log", compiling=False, workers=0) as job:
        assert job is None
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE")
    with precompiling(python, _workload(tmp_path), tmp_path / "b.log", compiling=False, workers=2) as job:
        assert job is None
    assert not (tmp_path / "cache").exists() and not (tmp_path / "a.log").exists()


def test_a_precompile_still_running_when_the_passes_end_is_stopped(tmp_path, monkeypatch):
    python, _ = _site(tmp_path)
    big = tmp_path / "site" / "torch" / "big.py"  # seconds to compile
    big.write_text("".join(f"v{i} = [{i}, {i} + 1, ({i}, 'x')]\n" for i in range(300_000)))
    _forbidding(monkeypatch, tmp_path)
    started = threading.Event()

    def progress(line: str) -> None:
        if line.startswith("compiling"):
            started.set()

    t0 = time.monotonic()
    with precompiling(python, _workload(tmp_path), tmp_path / "bytecode.log", False, progress, workers=2) as job:
        assert job is not None
        assert started.wait(60)
    assert time.monotonic() - t0 < 30
    assert job.summary() is None  # stopped before it was done
    left = [p for p in Path("/proc").glob("[0-9]*") if _cmdline(p).count(str(tmp_path / "workload.py"))]
    assert left == []


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def test_the_number_of_workers_follows_the_cpus_unless_the_user_sets_it():
    assert precompile_workers({WORKERS_ENV: "3"}) == 3
    assert precompile_workers({WORKERS_ENV: "0"}) == 0
    cpus = len(os.sched_getaffinity(0))
    assert precompile_workers({}) == (cpus - 4 if cpus >= 6 else 0)
    assert precompile_workers({WORKERS_ENV: "many"}) == precompile_workers({})
    # a multi-rank pass runs one interpreter per rank: those CPUs are kept too
    assert precompile_workers({}, passes=2) == precompile_workers({})
    assert precompile_workers({}, passes=cpus) == 0
    assert precompile_workers({WORKERS_ENV: "3"}, passes=cpus) == 3
