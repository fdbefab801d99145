"""The repository root as a Claude Code plugin: manifests, skills, agents, knowledge, and the real CLI's verdict.

`claude plugin validate --strict .` and `claude --plugin-dir <repo> mcp list` run the real Claude Code CLI
(npm `@anthropic-ai/claude-code@2.1.330`, installed outside the repository, e.g.
`npm install --prefix /tmp/cc @anthropic-ai/claude-code@2.1.330`; found through $CLAUDE_BIN, PATH or
/tmp/cc). Those tests skip, saying why, when the CLI, uv or the MCP server module is absent. `mcp list` runs
from a scratch directory on a copy of the files the server needs: inside the repository Claude Code would also
read .mcp.json as a project config, and uv writes uv.lock into a project that has none.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from mcp_server.schema.profile import AggregatedMetrics

PLUGIN = "operator-profiler"
MCP_PREFIX = "mcp__plugin_operator-profiler_operator-profiler__"
TOOLS = {"preflight", "profile", "map", "assemble", "analyze", "compare", "bench", "validate", "report",
         "top_operators", "operator_detail", "kernel_detail", "loop_status", "memory", "recipes", "optimize"}
BUILTIN_TOOLS = {"Read", "Write", "Edit", "Bash", "Glob", "Grep", "Agent"}
SKILLS = {"optimize", "preflight", "profile", "propose", "implement", "validate", "report"}
AGENTS = {"capture", "strategist", "backend-engineer", "validator"}
PLUGIN_FILES = [REPO / ".mcp.json", *(REPO / ".claude-plugin").glob("*.json")] + [
    p for folder in ("skills", "agents", "hooks", "knowledge", "prompts") for p in (REPO / folder).rglob("*")
    if p.is_file() and p.suffix in (".md", ".json", ".py", ".j2", ".yaml")
]
# What `uv run --project ${CLAUDE_PLUGIN_ROOT}` needs; copied, because uv writes uv.lock into the project when
# the repository has none.
SERVER_FILES = (".claude-plugin", ".mcp.json", "pyproject.toml", "README.md", "uv.lock", "mcp_server", "plugins",
                "prompts", "schemas", "knowledge")


def _claude() -> str:
    for candidate in (os.environ.get("CLAUDE_BIN"), shutil.which("claude"), "/tmp/cc/node_modules/.bin/claude"):
        if candidate and Path(candidate).exists():
            return candidate
    pytest.skip("Claude Code CLI not found: npm install --prefix /tmp/cc @anthropic-ai/claude-code@2.1.330 "
                "(or set CLAUDE_BIN)")


def _run_claude(args: list[str], cwd: Path, tmp_path: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "CLAUDE_CONFIG_DIR": str(tmp_path / "claude-config"), "MCP_TIMEOUT": "120000"}
    return subprocess.run([_claude(), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _frontmatter(path: Path) -> tuple[dict, str]:
    text = path.read_text(encoding="utf-8")
    _, head, body = text.split("---\n", 2)
    return yaml.safe_load(head), body


# --------------------------------------------------------------------------- the real CLI


def test_claude_plugin_validate_strict_passes(tmp_path: Path) -> None:
    proc = _run_claude(["plugin", "validate", "--strict", "."], REPO, tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    out = proc.stdout
    assert "Validation passed" in out
    assert {m for m in re.findall(rf"skills: {PLUGIN}:(\S+)", out)} == SKILLS
    assert {m for m in re.findall(rf"agents: {PLUGIN}:(\S+)", out)} == AGENTS
    assert "hooks: SessionStart" in out and "hooks: PostToolUse" in out
    assert f"mcpServers: {PLUGIN} stdio uv" in out


def test_claude_mcp_list_shows_the_server_connected(tmp_path: Path) -> None:
    if shutil.which("uv") is None:
        pytest.skip("uv is not on PATH: .mcp.json starts the server with `uv run`")
    plugin = tmp_path / "plugin"
    for entry in SERVER_FILES:
        source = REPO / entry
        if source.is_dir():
            shutil.copytree(source, plugin / entry, ignore=shutil.ignore_patterns("__pycache__"))
        elif source.is_file():
            shutil.copy2(source, plugin / entry)
    proc = _run_claude(["--plugin-dir", str(plugin), "mcp", "list"], tmp_path, tmp_path)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(f"plugin:{PLUGIN}:{PLUGIN}:")), "")
    assert "Connected" in line, proc.stdout[-3000:] + proc.stderr[-2000:]


# --------------------------------------------------------------------------- manifests


def test_manifests_and_mcp_launch() -> None:
    plugin = json.loads((REPO / ".claude-plugin" / "plugin.json").read_text())
    market = json.loads((REPO / ".claude-plugin" / "marketplace.json").read_text())
    assert plugin["name"] == market["name"] == PLUGIN
    assert market["plugins"] == [{**market["plugins"][0], "name": PLUGIN, "source": "./"}]
    server = json.loads((REPO / ".mcp.json").read_text())["mcpServers"][PLUGIN]
    assert [server["command"], *server["args"]] == [
        "uv", "run", "--quiet", "--project", "${CLAUDE_PLUGIN_ROOT}", "python", "-m", "mcp_server"]
    assert server["env"] == {"UV_PROJECT_ENVIRONMENT": "${CLAUDE_PLUGIN_DATA}/venv"}


def test_the_readme_names_uv_and_how_to_install_it() -> None:
    """The plugin's server starts with `uv run`: a user without uv must learn it from the README (and the hook)."""
    server = json.loads((REPO / ".mcp.json").read_text())["mcpServers"][PLUGIN]
    plugin_section = (REPO / "README.md").read_text().split("## Claude Code plugin", 1)[1].split("\n## ", 1)[0]
    assert server["command"] == "uv" and "[uv](https://docs.astral.sh/uv/) on PATH" in plugin_section
    assert "curl -LsSf https://astral.sh/uv/install.sh | sh" in plugin_section and "pip install uv" in plugin_section


def test_nothing_references_the_parent_directory() -> None:
    offenders = [str(p.relative_to(REPO)) for p in PLUGIN_FILES if "../" in p.read_text(encoding="utf-8")]
    assert not offenders


# --------------------------------------------------------------------------- skills and agents


def _referenced_paths(text: str) -> set[str]:
    return set(re.findall(r"\$\{CLAUDE_PLUGIN_ROOT\}/([\w./-]+\w)", text))


def _check_paths(paths: set[str], base: Path) -> None:
    missing = {p for p in paths if not (base / p).exists()}
    assert not missing


@pytest.mark.parametrize("name", sorted(SKILLS))
def test_skill(name: str) -> None:
    skill = REPO / "skills" / name
    meta, body = _frontmatter(skill / "SKILL.md")
    assert meta["name"] == name
    assert meta["description"].startswith("This skill should be used when the user asks to") or \
        meta["description"].startswith("This skill should be used when the user asks \"")
    assert len(re.findall(r'"[^"]+"', meta["description"])) >= 3, "quote the trigger phrases"
    assert f"{MCP_PREFIX}*" in meta["allowed-tools"]
    assert len(body.split()) < 2000
    assert "$ARGUMENTS" in body
    for heading in ("Inputs", "Outputs", "Failures"):
        assert heading.lower() in body.lower()
    for ref in re.findall(r"\$\{CLAUDE_SKILL_DIR\}/(references/[\w.-]+)", body):
        assert (skill / ref).is_file(), ref
    called = set(re.findall(r"[Cc]all(?:s|ing)? `(\w+)`", body)) | set(re.findall(r"the `(\w+)` tool", body))
    assert called <= TOOLS, f"{name} calls tools the server does not have: {called - TOOLS}"
    _check_paths(_referenced_paths(body), REPO)


def test_optimize_skill_resumes_from_every_stage() -> None:
    _, body = _frontmatter(REPO / "skills" / "optimize" / "SKILL.md")
    assert "--from=<stage>" in body
    stages = re.findall(r"^\| `(\w+)` \|", body, re.MULTILINE)
    assert stages == ["preflight", "profile", "recipes", "propose", "implement", "validate", "reprofile", "compare",
                      "bench", "report"]
    for stage in stages:
        assert f"**{stage}**" in body, f"the loop describes stage {stage}"


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_agent(name: str) -> None:
    meta, body = _frontmatter(REPO / "agents" / f"{name}.md")
    assert meta["name"] == name and meta["description"].startswith("Use this agent")
    tools = [t.strip() for t in meta["tools"].split(",")]
    for tool in tools:
        assert tool in BUILTIN_TOOLS or (tool.startswith(MCP_PREFIX) and tool[len(MCP_PREFIX):] in TOOLS), tool
    assert "Write" not in tools or name in ("strategist", "backend-engineer"), "only writers may write"
    output = body.split("## Output", 1)[1]
    for word in ("operator", "kernel", "file:line"):
        assert word in output or (word == "file:line" and ":<line>" in output), f"{name} Output lacks {word}"
    _check_paths(_referenced_paths(body), REPO)


def test_every_mcp_tool_named_in_the_texts_exists() -> None:
    texts = [p.read_text(encoding="utf-8") for p in PLUGIN_FILES if p.suffix == ".md"]
    named = {m for text in texts for m in re.findall(rf"{MCP_PREFIX}(\w+)", text)}
    assert named and named <= TOOLS


def _served_tools() -> dict[str, set[str]]:
    """Every tool the MCP server lists, with the parameters of its input schema (through the SDK's client)."""
    import anyio
    from mcp import Client

    from mcp_server.serve.app import server

    async def listed() -> dict[str, set[str]]:
        async with Client(server) as client:
            return {t.name: set(t.input_schema["properties"]) for t in (await client.list_tools()).tools}

    return anyio.run(listed)


# A backticked tool name starts a clause; the arguments the text gives it until the next tool name are written
# `name: value`, `name` = ..., `name` `value` or `name` <number>.
_TOOL_MENTION = re.compile(rf"`(\w+)`|{MCP_PREFIX}(\w+)")
_ARGUMENT = re.compile(r"`(\w+): [^`]*`|`(\w+)` ?= |`(\w+)` `[^`]+`|`(\w+)` \d")


def test_every_tool_argument_the_skills_and_agents_give_is_a_real_parameter() -> None:
    from mcp_server.schema.optimizations import OptimizationItem

    tools = _served_tools()
    assert set(tools) == TOOLS
    not_arguments = set(OptimizationItem.model_fields)  # optimizations.json fields quoted beside a call
    wrong = []
    for path in [p for folder in ("skills", "agents") for p in (REPO / folder).rglob("*.md")]:
        for paragraph in re.split(r"\n\s*\n|\n\s*(?:\d+\.|-) ", path.read_text(encoding="utf-8")):
            mentions = [(m, m.group(1) or m.group(2)) for m in _TOOL_MENTION.finditer(paragraph)]
            mentions = [(m, name) for m, name in mentions if name in tools]
            for i, (match, name) in enumerate(mentions):
                end = mentions[i + 1][0].start() if i + 1 < len(mentions) else len(paragraph)
                for found in _ARGUMENT.finditer(paragraph[match.end():end]):
                    argument = next(g for g in found.groups() if g)
                    if argument not in tools[name] and argument not in not_arguments:
                        wrong.append(f"{path.relative_to(REPO)}: `{name}` has no parameter `{argument}`")
    assert not wrong, "\n".join(wrong)


# --------------------------------------------------------------------------- knowledge


def test_metric_glossary_covers_every_metric_and_rollup() -> None:
    glossary = (REPO / "knowledge" / "metric_glossary.md").read_text(encoding="utf-8")
    metrics = yaml.safe_load((REPO / "plugins" / "ncu" / "metrics.yaml").read_text())["metrics"]
    missing = [key for key in metrics if f"`{key}`" not in glossary]
    missing += [f for f in AggregatedMetrics.model_fields if f"`{f}`" not in glossary]
    assert not missing


def test_capture_errors_cover_the_failures_the_skills_promise() -> None:
    text = (REPO / "knowledge" / "capture_errors.md").read_text(encoding="utf-8")
    for topic in ("nsys missing", ".qdstrm", "ERR_NVGPUCTRPERM", "No CUDA", "workload crashed", "ncu timed out"):
        assert topic.lower() in text.lower(), topic


def test_the_committed_uv_lock_matches_pyproject() -> None:
    """The plugin's server environment is resolved once, here, not afresh on a user's first start."""
    if shutil.which("uv") is None:
        pytest.skip("uv is not on PATH")
    proc = subprocess.run(["uv", "lock", "--check"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, "uv.lock is stale: run `uv lock` — " + proc.stderr[-2000:]
