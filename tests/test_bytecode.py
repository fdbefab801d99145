"""The bytecode cache given to children whose environment forbids writing bytecode and whose torch has none."""

from __future__ import annotations

import os
import py_compile
import sys
from pathlib import Path

import pytest

from mcp_server.preflight import _bytecode_check
from mcp_server.process import run_child
from mcp_server.process.bytecode import OPT_OUT, cache_dir, interpreter_env, uses_cache


def _interpreter(tmp_path: Path, compiled: bool) -> str:
    """An interpreter (a wrapper of this one) whose `torch` is a one-line package in tmp_path, with or without
    bytecode beside its source."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    source = site / "torch" / "__init__.py"
    source.write_text("__version__ = 'fake'\n")
    if compiled:
        py_compile.compile(str(source), doraise=True)
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def _environ(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPYCACHEPREFIX", OPT_OUT)}
    return {**env, "PYTHONDONTWRITEBYTECODE": "1", "XDG_CACHE_HOME": str(tmp_path / "cache"), **extra}


def test_no_bytecode_and_none_allowed_gets_a_cache_that_the_child_really_writes(tmp_path):
    python = _interpreter(tmp_path, compiled=False)
    environ = _environ(tmp_path)
    env = interpreter_env(python, environ)
    assert uses_cache(python, environ)
    assert "PYTHONDONTWRITEBYTECODE" not in env
    assert env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "cache" / "operator-profiler" / "pycache")
    assert env["PYTHONUNBUFFERED"] == "1"
    code, timed_out = run_child([python, "-c", "import torch"], tmp_path / "child.log", 60, env=env)
    assert (code, timed_out) == (0, False)
    torch_dir = tmp_path / "site" / "torch"
    mirrored = cache_dir(environ) / torch_dir.relative_to(torch_dir.anchor)
    assert [p.name.split(".")[0] for p in mirrored.glob("*.pyc")] == ["__init__"]
    assert not (tmp_path / "site" / "torch" / "__pycache__").exists()


def test_the_environment_is_left_alone_when_torch_has_bytecode(tmp_path):
    python = _interpreter(tmp_path, compiled=True)
    environ = _environ(tmp_path)
    assert not uses_cache(python, environ)
    assert interpreter_env(python, environ) == {**environ, "PYTHONUNBUFFERED": "1"}


@pytest.mark.parametrize(
    "extra",
    [{OPT_OUT: "off"}, {"PYTHONPYCACHEPREFIX": "/somewhere/else"}, {"PYTHONDONTWRITEBYTECODE": ""}],
    ids=["opted out", "prefix already set", "writing allowed"],
)
def test_the_environment_is_left_alone_when_the_user_decided(tmp_path, extra):
    python = _interpreter(tmp_path, compiled=False)
    environ = _environ(tmp_path, **extra)
    assert not uses_cache(python, environ)
    assert interpreter_env(python, environ) == {**environ, "PYTHONUNBUFFERED": "1"}


def test_an_interpreter_that_cannot_run_leaves_the_environment_alone(tmp_path):
    environ = _environ(tmp_path)
    assert not uses_cache(str(tmp_path / "no-such-python"), environ)


def test_run_child_without_env_inherits_this_process_environment(tmp_path):
    log = tmp_path / "env.log"
    probe = f"import os; print(os.environ.get('PATH') == {os.environ['PATH']!r})"
    code, _ = run_child([sys.executable, "-c", probe], log, 60)
    assert code == 0 and log.read_text().strip() == "True"


def test_preflight_says_when_passes_get_the_cache(tmp_path, monkeypatch):
    python = _interpreter(tmp_path, compiled=False)
    for key, value in _environ(tmp_path).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.delenv(OPT_OUT, raising=False)
    check = _bytecode_check(python)
    assert check is not None and check.ok
    assert str(tmp_path / "cache" / "operator-profiler" / "pycache") in check.detail
    assert "it is empty now" in check.detail
    held = tmp_path / "cache" / "operator-profiler" / "pycache" / "site" / "m.cpython-311.pyc"
    held.parent.mkdir(parents=True)
    held.write_bytes(b"\0" * 3 * 2**20)
    assert "it holds 3 MiB now" in _bytecode_check(python).detail
    monkeypatch.setenv("OPERATOR_PROFILER_PRECOMPILE_WORKERS", "3")
    assert "the first run compiles it there in 3 workers beside the passes" in _bytecode_check(python).detail
    monkeypatch.setenv("OPERATOR_PROFILER_PRECOMPILE_WORKERS", "0")
    assert "the passes compile it themselves" in _bytecode_check(python).detail
    monkeypatch.setenv(OPT_OUT, "off")
    assert _bytecode_check(python) is None
