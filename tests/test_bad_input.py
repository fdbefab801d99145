"""Bad input: a one-line error with a remedy, a non-zero exit, and no partial profile.json."""

from __future__ import annotations

import json

import pytest
from conftest import REPO
from test_cli_cpu import run_cli

SCRIPTS = REPO / "tests" / "scripts"


def _assert_one_line_error(proc, *needles: str) -> None:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("operator-profiler: error:")]
    assert len(errors) == 1, proc.stderr
    assert " — " in errors[0], "the error carries a remedy"
    for needle in needles:
        assert needle in errors[0], errors[0]


def test_missing_file(tmp_path):
    proc = run_cli("profile", str(tmp_path / "nope.py"), "-o", str(tmp_path / "run"))
    _assert_one_line_error(proc, "workload not found", "nope.py")
    assert not (tmp_path / "run" / "profile.json").exists()


def test_file_without_contract(tmp_path):
    proc = run_cli("profile", str(SCRIPTS / "no_contract.py"), "-o", str(tmp_path / "run"))
    _assert_one_line_error(proc, "get_model_and_input", "workload contract")
    assert not (tmp_path / "run" / "profile.json").exists()


@pytest.mark.parametrize("verb", ["optimize", "recipes"])
def test_a_plain_script_given_to_a_verb_that_runs_the_contracts_model(tmp_path, verb):
    """optimize and recipes need the model get_model_and_input() returns: a plain script is refused before any folder
    is made, pointing at `run --script` for a look at it as it is."""
    proc = run_cli(verb, str(SCRIPTS / "plain_train.py"), "-o", str(tmp_path / "out"))
    _assert_one_line_error(proc, "workload ", "neither defines nor imports get_model_and_input()",
                           "operator-profiler run --script plain_train.py")
    assert "workload workload" not in proc.stderr and "stopped at" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_workload_that_raises(tmp_path):
    proc = run_cli("profile", str(SCRIPTS / "raises.py"), "-o", str(tmp_path / "run"))
    _assert_one_line_error(proc, "RuntimeError: shape mismatch in layer 3", "last lines:", "output.log")
    assert not (tmp_path / "run" / "profile.json").exists()



def test_a_model_whose_lazy_modules_were_never_called(tmp_path):
    """Their weights have no shape until the first call: every cast, count and compile would fail on them."""
    proc = run_cli("profile", str(SCRIPTS / "lazy_modules.py"), "-o", str(tmp_path / "run"))
    _assert_one_line_error(proc, "lazy modules are not initialised yet (0, 2)",
                           "call the model once on its inputs in get_model_and_input()")
    assert not (tmp_path / "run" / "profile.json").exists()

def test_unknown_compile_mode(tmp_path, example):
    proc = run_cli("profile", str(example("conv_block")), "--compile-mode", "turbo", "-o", str(tmp_path / "run"))
    _assert_one_line_error(proc, "turbo", "eager, inductor, cudagraphs")
    assert not (tmp_path / "run").exists()


def test_unwritable_output(tmp_path, example):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    proc = run_cli("profile", str(example("conv_block")), "-o", str(blocker / "run"))
    _assert_one_line_error(proc, "cannot write to output directory")


@pytest.mark.parametrize("content,needle", [("{broken", "not valid JSON"), ('{"schema_version": "9.1"}', "9.1")])
def test_corrupt_or_foreign_profile(tmp_path, content, needle):
    path = tmp_path / "profile.json"
    path.write_text(content)
    _assert_one_line_error(run_cli("summary", str(path)), needle)


def test_unavailable_backend(tmp_path, example):
    proc = run_cli("profile", str(example("conv_block")), "--backend", "nsys", "-o", str(tmp_path / "run"))
    _assert_one_line_error(proc, "backend nsys needs", "--backend torch")
    assert not (tmp_path / "run").exists()


def test_unknown_backend(tmp_path, example):
    proc = run_cli("profile", str(example("conv_block")), "--backend", "rocprof9", "-o", str(tmp_path / "run"))
    _assert_one_line_error(proc, "unknown backend")


def test_interpreter_without_torch(tmp_path, example):
    venv = tmp_path / "venv"
    import venv as venv_mod

    venv_mod.create(venv, with_pip=False)
    proc = run_cli("profile", str(example("conv_block")), "--python", str(venv / "bin" / "python"),
                   "-o", str(tmp_path / "run"))
    _assert_one_line_error(proc, "cannot import torch", "--python")
    result = json.loads((tmp_path / "run" / "torch" / "harness.json").read_text())
    assert result["error"]["kind"] == "no_torch"
