"""Both faces expose every option of the request models they are made from: adding a field to a verb's request or
an option group is a CLI flag and an MCP parameter at once (each tool's parameters are exactly its verb's fields),
every argument's and parameter's description comes from its field, and a bad value is a one-line error in either."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from pydantic import BaseModel

from mcp_server.cli import build_parser, options_from
from mcp_server.errors import UsageError
from mcp_server.schema.flags import FACE_SET, cli_flag, cli_flags, option_group
from mcp_server.schema.requests import (
    WINDOW_OPTIONS,
    AnalyzeRequest,
    AssembleRequest,
    BenchRequest,
    CaptureOptions,
    CompareRequest,
    KernelDetailRequest,
    LoopStatusRequest,
    MapRequest,
    MemoryRequest,
    NcuOptions,
    OperatorDetailRequest,
    OptimizeRequest,
    PreflightRequest,
    ProfileRequest,
    RecipesRequest,
    RecipeTiming,
    ReportRequest,
    SummaryRequest,
    TimingOptions,
    ValidateRequest,
)
from mcp_server.serve.app import server
from mcp_server.serve.paths import PROJECT_ENV
from mcp_server.serve.tools import generated


def _subparser(name: str) -> argparse.ArgumentParser:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def _flags(name: str) -> set[str]:
    return {flag for action in _subparser(name)._actions for flag in action.option_strings}


VERBS: dict[str, type[BaseModel]] = {
    "profile": ProfileRequest, "run": ProfileRequest, "memory": MemoryRequest, "map": MapRequest,
    "assemble": AssembleRequest, "summary": SummaryRequest, "analyze": AnalyzeRequest, "compare": CompareRequest,
    "bench": BenchRequest, "recipes": RecipesRequest, "optimize": OptimizeRequest, "validate": ValidateRequest,
    "report": ReportRequest, "preflight": PreflightRequest, "loop-status": LoopStatusRequest,
}
CLI_OWN = {"help", "python", "quiet", "verbose", "json"}  # the command line's own options, written once in cli.py


def _tool_parameters() -> dict[str, set[str]]:
    async def listed() -> dict[str, set[str]]:
        async with Client(server) as client:
            return {t.name: set(t.input_schema["properties"]) for t in (await client.list_tools()).tools}

    return anyio.run(listed)


@pytest.mark.parametrize("model, commands, tools", [
    (CaptureOptions, ("profile", "run"), ("profile",)),
    (NcuOptions, ("run", "map"), ("map",)),
])
def test_every_option_is_a_flag_and_a_parameter(model: type[BaseModel], commands: tuple[str, ...],
                                                tools: tuple[str, ...]):
    parameters = _tool_parameters()
    for name, field in model.model_fields.items():
        for command in commands:
            assert cli_flag(name, field).name in _flags(command), (command, name)
        for tool in tools:
            assert name in parameters[tool], (tool, name)


def test_flags_parse_into_the_options_and_the_options_print_as_the_same_flags():
    options = NcuOptions(dedupe=False, kernel_regex="gemm", launch_skip=0, launch_count=4, metric_set="full",
                         sections=("SpeedOfLight", "Occupancy"), ncu_sudo=True)
    args = _subparser("map").parse_args(["RUN", *cli_flags(options)])
    assert options_from(args, NcuOptions) == options
    capture = CaptureOptions(compile_mode="cudagraphs", warmup_iters=0, iters=2, seed=7, train_step=True,
                             timeout_s=30.0)
    args = _subparser("run").parse_args(["w.py", *cli_flags(capture)])
    assert options_from(args, CaptureOptions) == capture
    assert options_from(_subparser("run").parse_args(["w.py"]), NcuOptions) == NcuOptions()


@pytest.mark.parametrize("argv, needle", [
    (["--launch-skip", "-1"], "--launch-skip: input should be greater than or equal to 0"),
    (["--kernel-regex=-gemm"], "--kernel-regex: '-gemm' looks like a command-line option"),
    (["--max-kernels", "0"], "--max-kernels: input should be greater than or equal to 1"),
])
def test_a_bad_flag_value_is_a_usage_error_naming_the_flag(argv: list[str], needle: str):
    with pytest.raises(UsageError) as error:
        options_from(_subparser("run").parse_args(["w.py", *argv]), NcuOptions)
    assert needle in error.value.one_line() and error.value.remedy


def test_a_bad_parameter_value_is_a_tool_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(PROJECT_ENV, str(tmp_path))

    async def called() -> Any:
        async with Client(server) as client:
            return await client.call_tool("map", {"run_dir": str(tmp_path), "kernel_regex": "-gemm"})

    result = anyio.run(called)
    assert result.is_error and "kernel_regex: '-gemm' looks like a command-line option" in result.content[0].text


@pytest.mark.parametrize("command", sorted(VERBS))
def test_every_argument_is_a_field_of_the_verbs_request_and_its_help_the_fields_description(command: str):
    groups = (VERBS[command], CaptureOptions, NcuOptions, TimingOptions, RecipeTiming)
    for action in _subparser(command)._actions:
        if action.dest in CLI_OWN or action.help == argparse.SUPPRESS:
            continue
        fields = [g.model_fields[action.dest] for g in groups if action.dest in g.model_fields]
        assert fields, (command, action.dest)
        described = [f.description.replace("%", "%%") for f in fields if f.description]
        assert not described or any(d in (action.help or "") for d in described), (command, action.dest)


def test_every_tool_parameter_named_like_a_request_field_is_described_by_that_field():
    async def listed() -> dict[str, dict[str, Any]]:
        async with Client(server) as client:
            return {t.name: t.input_schema["properties"] for t in (await client.list_tools()).tools}

    tools = anyio.run(listed)
    verbs = {name.replace("-", "_"): model for name, model in VERBS.items()}
    for tool, properties in tools.items():
        model = verbs.get(tool)
        for name, schema in properties.items():
            if model is None or name not in model.model_fields:
                continue
            field = model.model_fields[name]
            if "description" in schema:
                assert schema["description"] == field.description, (tool, name)
            if "default" in schema:  # a tool's default is its request's
                assert schema["default"] == json.loads(json.dumps(field.default)), (tool, name)


TOOLS: dict[str, tuple[type[BaseModel], set[str]]] = {  # each tool's verb, and the fields it leaves to the face
    "preflight": (PreflightRequest, set()), "profile": (ProfileRequest, {"ncu", "require_counters"}),
    "memory": (MemoryRequest, set()), "map": (MapRequest, set()), "assemble": (AssembleRequest, set()),
    "analyze": (AnalyzeRequest, set()), "compare": (CompareRequest, set()), "bench": (BenchRequest, set()),
    "recipes": (RecipesRequest, set()), "optimize": (OptimizeRequest, set()), "validate": (ValidateRequest, set()),
    "report": (ReportRequest, set()), "top_operators": (SummaryRequest, set()),
    "operator_detail": (OperatorDetailRequest, set()), "kernel_detail": (KernelDetailRequest, set()),
    "loop_status": (LoopStatusRequest, set()),
}
FACE_OWN = {"profile": {"counters"}, "top_operators": {"limit"}}  # top_operators calls SummaryRequest's top limit


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_every_tool_parameter_is_a_field_of_its_verbs_request_and_every_field_a_parameter(tool: str):
    model, left = TOOLS[tool]
    expected: set[str] = set()
    for name, field in model.model_fields.items():
        group = option_group(field)
        if name in FACE_SET | left or (tool == "top_operators" and name == "top"):
            continue
        if group is not None and name != "python":
            only = WINDOW_OPTIONS if tool == "memory" else tuple(group.model_fields)
            expected |= set(only)
        else:
            expected.add(name)
    assert _tool_parameters()[tool] == expected | FACE_OWN.get(tool, set())


def test_a_tool_declaring_a_field_of_its_verb_itself_is_refused_at_registration():
    class Listing(BaseModel):
        top: int = 10
        python: str
        capture: CaptureOptions = CaptureOptions()

    async def listing(ctx: Any, top: int = 20, **values: Any) -> None:
        """A tool that writes a parameter its verb declares."""

    with pytest.raises(TypeError, match="tool listing: parameter top is a field of Listing: the model declares it"):
        generated(listing, Listing, {"capture": None})

    async def grouped(ctx: Any, **values: Any) -> None:
        """A tool that says nothing of its verb's option group."""

    with pytest.raises(TypeError, match="option group capture of Listing is neither in groups nor hidden"):
        generated(grouped, Listing, {})
    parameters = generated(grouped, Listing, {"capture": ("iters",)}).parameters
    assert list(parameters) == ["ctx", "top", "python", "iters"]
    assert parameters["python"].default is None and parameters["top"].default == 10


def test_a_top_operators_call_takes_its_limit_as_the_requests_top(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(PROJECT_ENV, str(tmp_path))

    async def called() -> Any:
        async with Client(server) as client:
            return await client.call_tool("top_operators", {"profile": "missing.json", "limit": 0})

    result = anyio.run(called)  # the bound is SummaryRequest.top's, under the tool's name for it
    text = result.content[0].text
    assert result.is_error and "limit" in text and "greater than or equal to 1" in text


def test_the_instructions_describe_the_shared_parameters_in_their_fields_words():
    from mcp_server.schema.requests import TORCHRUN_OPTIONS
    from mcp_server.serve.schemas import SHARED
    from mcp_server.serve.tools import INSTRUCTIONS

    text = " ".join(INSTRUCTIONS.split())
    fields = {**TimingOptions.model_fields, **{n: CaptureOptions.model_fields[n] for n in TORCHRUN_OPTIONS}}
    for name in SHARED:  # left out of every schema: said once, in the field's own words
        description = (fields[name].description or "").rstrip(".")
        assert f"{name} = {description[:1].lower()}{description[1:]}" in text, name
    tier = (ValidateRequest.model_fields["tier"].description or "").rstrip(".")
    assert f"tier = {tier[:1].lower()}{tier[1:]}" in text


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_flag_says_what_it_does(verb: str):
    """`--help` tells the truth only where it tells something: every option of every verb has a help text."""
    silent = [a.option_strings[0] for a in _subparser(verb)._actions if a.option_strings and not a.help]
    assert silent == [], f"{verb}: {silent} have no help text"


@pytest.mark.parametrize("verb", ["assemble", "analyze", "compare", "report"])
def test_the_verbs_that_only_read_take_quiet_as_the_others_do(verb: str):
    assert {"--quiet", "-q"} <= _flags(verb)
