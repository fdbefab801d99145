"""The MCP server as a separate process over stdio: the SDK's stdio client, the MCP Inspector's CLI (an
independent client, when Node is available), cancellation across the wire, and start-up time."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import REPO
from mcp import Client, StdioServerParameters

FIXTURE = REPO / "tests" / "fixtures" / "h200_conv_block_eager.tar.xz"
TOOLS = {"preflight", "profile", "map", "assemble", "analyze", "compare", "bench", "validate", "report",
         "top_operators", "operator_detail", "kernel_detail", "loop_status", "memory", "recipes", "optimize"}
ENGINE_MODULES = ("torch", "mcp_server.api", "mcp_server.capture", "mcp_server.assemble", "mcp_server.process",
                  "mcp_server.proof", "mcp_server.compare", "mcp_server.preflight", "mcp_server.render", "plugins",
                  "mcp_server.analysis", "matplotlib")
STARTUP_LIMIT_S = 1.0
OWN_LIMIT_S = 0.3  # what the server adds to importing the MCP SDK: its schema, tools, the handshake
TOOLS_LIST_LIMIT = 25_000  # characters of the tools/list answer an agent loads into its context every session
INSPECTOR = "@modelcontextprotocol/inspector"
NPM_TROUBLE = ("npm error", "npm ERR!", "ENOTFOUND", "ETIMEDOUT", "ENOTCACHED", "EAI_AGAIN", "ECONNREFUSED")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project folder holding a recorded H200 run directory (conv_block_eager, nsys+ncu)."""
    root = tmp_path_factory.mktemp("stdio_project")
    with tarfile.open(FIXTURE, "r:xz") as tar:
        tar.extractall(root, filter="data")
    return root


def server_params(project: Path) -> StdioServerParameters:
    """`python -m mcp_server` started in the project folder (its working directory is the client's)."""
    env = {k: v for k, v in os.environ.items() if k != "CLAUDE_PROJECT_DIR"}
    env["OPERATOR_PROFILER_PYTHON"] = sys.executable
    return StdioServerParameters(command=sys.executable, args=["-m", "mcp_server"], cwd=str(project), env=env)


def test_stdio_round_trip(project: Path):
    said: list[str] = []

    async def session() -> tuple[set[str], dict[str, Any], dict[str, Any], str]:
        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            said.append(message or "")

        async with Client(server_params(project)) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            run = await client.call_tool("assemble", {"run_dir": "conv_block_eager"}, progress_callback=on_progress)
            top = await client.call_tool("top_operators", {"profile": "conv_block_eager", "limit": 2})
            missing = await client.call_tool("profile", {"workload": "nowhere.py"})
            assert missing.is_error
            return names, run.structured_content, top.structured_content, missing.content[0].text

    names, run, top, missing = anyio.run(session)
    assert names == TOOLS
    assert run["run_dir"] == str(project / "conv_block_eager") and run["window"]["kernel_count"] == 23
    assert Path(run["profile_path"]).is_file()
    assert said == [f"assemble: {project / 'conv_block_eager'}", "assembling profile.json"]
    assert top["operators"][0]["operator_name"] == run["top_operators"][0]["operator_name"]
    assert f"workload not found: {project / 'nowhere.py'}" in missing and "relative paths resolve against" in missing


def slow_workload(project: Path, name: str) -> Path:
    """A workload that writes its pid to <name>.pid, then sleeps in get_model_and_input(); returns the pid file."""
    pid_file = project / f"{name}.pid"
    (project / f"{name}.py").write_text(
        "import os, time\nfrom pathlib import Path\nimport torch\n\n\ndef get_model_and_input():\n"
        f"    Path({str(pid_file)!r}).write_text(str(os.getpid()))\n    time.sleep(120)\n"
        "    return torch.nn.Identity(), (torch.zeros(1),)\n"
    )
    return pid_file


async def wait_for_pid(pid_file: Path) -> int:
    with anyio.fail_after(60):
        while not pid_file.is_file() or not pid_file.read_text():
            await anyio.sleep(0.05)
    return int(pid_file.read_text())


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie waiting for its parent to reap it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):  # gone before, or while, its stat was read
        return False
    return state != "Z"


async def wait_gone(pid: int, within_s: float = 15.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and alive(pid):
        await anyio.sleep(0.1)
    return not alive(pid)


def test_cancelling_over_stdio_kills_the_workload(project: Path):
    pid_file = slow_workload(project, "stdio_slow")

    async def session() -> tuple[int, bool, set[str]]:
        async with Client(server_params(project)) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.call_tool, "profile", {"workload": "stdio_slow.py"})
                pid = await wait_for_pid(pid_file)
                tg.cancel_scope.cancel()
            dead = await wait_gone(pid)
            still_serving = {t.name for t in (await client.list_tools()).tools}
            return pid, dead, still_serving

    pid, dead, names = anyio.run(session)
    assert dead, f"the workload's process {pid} outlived the cancelled request"
    assert names == TOOLS, "the server keeps serving after a cancelled call"


def test_sigterm_to_the_server_stops_its_workloads(project: Path):
    pid_file = slow_workload(project, "stdio_sigterm")
    seen: dict[str, Any] = {}

    async def session() -> None:
        async with Client(server_params(project)) as client, anyio.create_task_group() as tg:
            async def call() -> None:
                with contextlib.suppress(Exception):  # the server dies under this call
                    await client.call_tool("profile", {"workload": "stdio_sigterm.py"})

            tg.start_soon(call)
            seen["pid"] = await wait_for_pid(pid_file)
            seen["server"] = int(Path(f"/proc/{seen['pid']}/stat").read_text().rsplit(")", 1)[1].split()[1])
            os.kill(seen["server"], signal.SIGTERM)
            seen["workload_gone"] = await wait_gone(seen["pid"])
            seen["server_gone"] = await wait_gone(seen["server"])
            tg.cancel_scope.cancel()

    anyio.run(session)
    assert seen["workload_gone"], f"the workload {seen['pid']} outlived its server {seen['server']} (SIGTERM)"
    assert seen["server_gone"]


def _sdk_import_s(project: Path) -> float:
    """A fresh interpreter importing the MCP SDK's server and nothing of ours, on this machine now."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import mcp.server.mcpserver"], cwd=project, check=True, timeout=60)
    return time.perf_counter() - t0


def test_tools_list_answers_within_a_second_of_start(project: Path):
    """Within STARTUP_LIMIT_S of the server's start; or, on a machine where the SDK's own import takes most of that
    (this 2-core machine: 0.8-1.7 s at times), within OWN_LIMIT_S of that import timed just before: what the
    server adds to it."""
    async def one() -> tuple[float, int]:
        t0 = time.perf_counter()
        async with Client(server_params(project)) as client:
            count = len((await client.list_tools()).tools)
            return time.perf_counter() - t0, count

    # Best of three rounds: the shared CI machine may be busy with another process for a moment.
    rounds = [(_sdk_import_s(project), *anyio.run(one)) for _ in range(3)]
    assert all(n == len(TOOLS) for _, _, n in rounds)
    best, own = min(t for _, t, _ in rounds), min(t - sdk for sdk, t, _ in rounds)
    assert best < STARTUP_LIMIT_S or own < OWN_LIMIT_S, (
        f"start-up to tools/list took {[round(t, 3) for _, t, _ in rounds]} s, importing the MCP SDK alone just "
        f"before {[round(sdk, 3) for sdk, _, _ in rounds]} s")


def _raw_tools_list(project: Path) -> str:
    """The tools/list answer exactly as the server writes it on stdout, after the handshake: one JSON-RPC line."""
    proc = subprocess.Popen([sys.executable, "-m", "mcp_server"], cwd=project, env=server_params(project).env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        for message in ({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                            "protocolVersion": "2025-11-25", "capabilities": {},
                            "clientInfo": {"name": "size-check", "version": "0"}}},
                        {"jsonrpc": "2.0", "method": "notifications/initialized"},
                        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}):
            proc.stdin.write(json.dumps(message) + "\n")
            proc.stdin.flush()
        lines = [proc.stdout.readline() for _ in range(2)]
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert json.loads(lines[1])["id"] == 2, lines[1][:300]
    return lines[1].rstrip("\n")


def _titles(node: Any) -> list[str]:
    """The schema keywords `title` anywhere below `node` (a parameter may be called title: its key is not one)."""
    if isinstance(node, list):
        return [t for item in node for t in _titles(item)]
    if not isinstance(node, dict):
        return []
    found = [node["title"]] if isinstance(node.get("title"), str) else []
    for key, value in node.items():
        found += [t for v in value.values() for t in _titles(v)] if key == "properties" else _titles(value)
    return found


def test_tools_list_is_small_enough_for_an_agent_and_keeps_structured_output(project: Path):
    answer = _raw_tools_list(project)
    assert len(answer) <= TOOLS_LIST_LIMIT, f"tools/list is {len(answer)} characters"
    tools = json.loads(answer)["result"]["tools"]
    assert {t["name"] for t in tools} == TOOLS
    for tool in tools:  # every result is still structured, and the schemas name what a call takes and returns
        assert tool["outputSchema"]["type"] == "object" and tool["outputSchema"]["properties"], tool["name"]
        assert tool["inputSchema"]["additionalProperties"] is False, tool["name"]
        assert not _titles(tool["inputSchema"]), tool["name"]  # pydantic's titles repeat the names
    profile = next(t for t in tools if t["name"] == "profile")
    assert {"run_dir", "profile_path", "top_operators", "warnings"} <= set(profile["outputSchema"]["properties"])


def test_server_start_up_imports_no_engine_module_and_no_torch():
    probe = ("import sys, mcp_server.serve.app; "
             f"print([m for m in sys.modules if m.startswith({ENGINE_MODULES!r})])")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == "[]"


def _inspector(project: Path, *args: str) -> dict[str, Any]:
    """Run the MCP Inspector's CLI against `python -m mcp_server`; skip when npm cannot provide it."""
    npx = shutil.which("npx")
    if npx is None:
        pytest.skip("npx (Node.js) is not installed: the MCP Inspector CLI check needs it")
    cmd = [npx, "--prefer-offline", "--yes", INSPECTOR, "--cli", sys.executable, "-m", "mcp_server", *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=project, check=False)
    except subprocess.TimeoutExpired:
        pytest.skip(f"npx could not fetch or start {INSPECTOR} within 240 s")
    if proc.returncode != 0 and any(t in proc.stderr for t in NPM_TROUBLE):
        pytest.skip(f"npm could not provide {INSPECTOR}: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_mcp_inspector_cli_lists_and_calls_tools(project: Path):
    listed = _inspector(project, "--method", "tools/list")
    assert {t["name"] for t in listed["tools"]} == TOOLS
    assert all("outputSchema" in t for t in listed["tools"])
    called = _inspector(project, "--method", "tools/call", "--tool-name", "assemble",
                        "--tool-arg", "run_dir=conv_block_eager_torch", "--tool-arg", "top=3")
    assert not called.get("isError"), called
    content = called["structuredContent"]
    assert content["backend"] == "torch" and content["interpreter"]["source"] == "manifest"
    assert content["profile"]["profile_path"] == str(project / "conv_block_eager_torch" / "profile.json")
    assert len(content["top_operators"]) == 3
