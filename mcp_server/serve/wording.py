"""The engine's messages in the MCP face's words: a remedy written for the command line (`pass --python PATH`,
`raise --timeout`, `see --help`, `run `operator-profiler preflight``) names the tool parameter or the tool an agent
calls instead (`pass python=PATH`, `raise timeout_s`, `see the tool's parameters`, `run the preflight tool`).

The option groups' flags come from their request models (`cli_flag`), the other verbs' flags from `FLAGS`; any
other `--word` (an nsys or ncu option quoted in a message) is left as it is.
"""

from __future__ import annotations

import functools
import re

from mcp_server.schema.flags import cli_flag
from mcp_server.schema.requests import CaptureOptions, NcuOptions

# The CLI's own flags outside the option groups, and the MCP parameter each one is.
FLAGS = {
    "--python": "python", "--output": "output", "-o": "output", "--timeout": "timeout_s", "--seeds": "seeds",
    "--tolerance": "tolerances", "--bench": "bench_json", "--no-tests": "run_tests=false", "--top": "top",
    "--no-microbench": "measure=false", "--quick": "quick", "--backend": "backend",
    "--allow-mismatch": "allow_mismatch", "--baseline-mode": "baseline_mode", "--tier": "tier", "--reps": "reps",
    "--rounds": "rounds", "--warmup": "warmup", "--input-sets": "input_sets", "--speedup": "speedup",
    "--max-plausible-speedup": "max_plausible_speedup", "--analysis": "analysis", "--rtol": "rtol", "--atol": "atol",
    "--optimizations": "optimizations", "--validation": "validation", "--plan": "plan",
    "--optimized-profile": "optimized_profile", "--baseline-analysis": "baseline_analysis",
    "--comparison": "comparison", "--bench-vs-compile": "bench_vs_compile", "--bench-vs-free": "bench_vs_free",
}
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*|-o)(?: ([A-Z][A-Z_]*)\b)?")
_HELP = re.compile(r"see `?(?:operator-profiler(?: \S+)? )?--help`?")
_COMMAND = re.compile(r"`operator-profiler ([a-z-]+)[^`]*`")


@functools.cache
def _parameters() -> dict[str, str]:
    """Every CLI flag that is an MCP parameter, with the parameter's spelling (`dedupe=false` for `--no-dedupe`)."""
    names = dict(FLAGS)
    for model in (CaptureOptions, NcuOptions):
        for name, field in model.model_fields.items():
            flag = cli_flag(name, field).name
            names[flag] = f"{name}=false" if flag.startswith("--no-") else name
    return names


def mcp_words(text: str) -> str:
    """`text` with the command line's flags and commands spelled as MCP parameters and tools."""
    names = _parameters()

    def parameter(match: re.Match[str]) -> str:
        name = names.get(match.group(1))
        if name is None:
            return match.group(0)
        return f"{name}={match.group(2)}" if match.group(2) and "=" not in name else name

    text = _HELP.sub("see the tool's parameters", text)
    text = _COMMAND.sub(lambda m: f"the {m.group(1).replace('-', '_')} tool", text)
    return _FLAG.sub(parameter, text)
