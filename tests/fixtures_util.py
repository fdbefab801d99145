"""Recorded real GPU artifacts, and independent readers of their raw data for the tests to check against.

`tests/fixtures/h200_<name>.tar.xz` each hold run directories recorded on an H200 by
`scripts/record_gpu_fixtures.py`: `<workload>_<mode>/` (nsys + ncu passes) and `<workload>_<mode>_torch/`
(torch.profiler pass), or a single `..._torch/` run for `h200_conv_block_eager_train` and `h200_gpt2_eager_full`.
Each archive is extracted once per test session.

The `raw_*` helpers read the artifacts with plain `sqlite3`, `json` and `ncu_report` calls and share no code
with the adapters under test, so that expected numbers are computed independently of the code they check.
"""

from __future__ import annotations

import json
import lzma
import re
import shutil
import sqlite3
import subprocess
import sys
import tarfile
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from mcp_server.schema.profile import KernelRecord, OperatorAttributedProfile

FIXTURES = Path(__file__).resolve().parent / "fixtures"
GPU = "h200"
MEASURE = "operator_profiler::measure"

# Run directories of the nsys + ncu backend and of the torch.profiler backend, by name.
NSYS_RUNS = ("conv_block_eager", "conv_block_inductor", "gpt2_eager", "gpt2_inductor")
TORCH_RUNS = (
    "conv_block_eager_torch",
    "conv_block_inductor_torch",
    "gpt2_eager_torch",
    "gpt2_inductor_torch",
    "conv_block_eager_train_torch",
    "gpt2_eager_full_torch",
)
ALL_RUNS = NSYS_RUNS + TORCH_RUNS


def archive_of(run: str) -> str:
    """Archive name (without `.tar.xz`) holding run directory `run`: `gpt2_eager_torch` -> `h200_gpt2_eager`."""
    return f"{GPU}_{run.removesuffix('_torch')}"


def resnet50_nsys(directory: Path) -> Path:
    """The nsys export of torchvision's ResNet-50 (eager, batch 32), recorded on an H100 by
    `operator-profiler run scripts/gpu_workloads/resnet50.py` (its nsys/report.sqlite, xz-compressed), written into
    `directory`."""
    db = directory / "report.sqlite"
    with lzma.open(FIXTURES / "h100_resnet50_eager_nsys.sqlite.xz") as src, db.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return db


def extract_fixture(name: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Extract `tests/fixtures/<name>.tar.xz` (once per session) and return the folder holding its run directories.

    A second call with the same name reuses the extracted copy.
    """
    archive = FIXTURES / f"{name}.tar.xz"
    if not archive.is_file():
        raise FileNotFoundError(f"fixture archive not found: {archive}")
    target = tmp_path_factory.getbasetemp() / "fixtures" / name
    done = target / ".extracted"
    if not done.exists():
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive, "r:xz") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(target, filter="data")
            else:  # Python without extraction filters (< 3.10.12 / 3.11.4): the archives are our own
                tar.extractall(target)
        done.touch()
    if not any(p.is_dir() for p in target.iterdir()):
        raise ValueError(f"{archive} holds no run directory")
    return target


def run_dir(run: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The extracted run directory `run` (one of ALL_RUNS)."""
    path = extract_fixture(archive_of(run), tmp_path_factory) / run
    if not (path / "manifest.json").is_file():
        raise FileNotFoundError(f"{archive_of(run)}.tar.xz holds no run directory {run}/ with a manifest.json")
    return path


# ---------------------------------------------------------------------------------------------------------------
# nsys SQLite export


@dataclass
class RawKernel:
    """One kernel row of an nsys export, joined to its launching runtime call."""

    correlation_id: int
    start: int
    end: int
    device: int
    stream: int
    demangled: str
    mangled: str
    short: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    registers: int
    static_smem: int
    dynamic_smem: int
    global_tid: int
    api_start: int

    @property
    def config(self) -> tuple[str, tuple[int, int, int], tuple[int, int, int]]:
        """(demangled name, grid, block)."""
        return (self.demangled, self.grid, self.block)


def raw_measure_range(conn: sqlite3.Connection) -> tuple[int, int, int]:
    """(start, end, globalTid) of the single `operator_profiler::measure` push/pop range."""
    rows = conn.execute(
        "SELECT n.start, n.end, n.globalTid FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId "
        "WHERE n.eventType = 59 AND COALESCE(n.text, s.value) = ?",
        (MEASURE,),
    ).fetchall()
    assert len(rows) == 1, rows
    return rows[0]


def interval_union(intervals: list[tuple[int, int]]) -> int:
    """Total length of the union of [start, end] intervals, computed here (independent of the engine's)."""
    total, end = 0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def raw_window_kernels(sqlite_path: Path) -> list[RawKernel]:
    """Kernels whose runtime launch call starts inside the measure range, ordered by that call's start."""
    with sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True) as conn:
        start, end, _ = raw_measure_range(conn)
        rows = conn.execute(
            """
            SELECT k.correlationId, k.start, k.end, k.deviceId, k.streamId, d.value, m.value, s.value,
                   k.gridX, k.gridY, k.gridZ, k.blockX, k.blockY, k.blockZ, k.registersPerThread,
                   k.staticSharedMemory, k.dynamicSharedMemory, r.globalTid, r.start
            FROM CUPTI_ACTIVITY_KIND_KERNEL k
            JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
            JOIN StringIds d ON d.id = k.demangledName
            JOIN StringIds m ON m.id = k.mangledName
            JOIN StringIds s ON s.id = k.shortName
            WHERE r.start BETWEEN ? AND ?
            ORDER BY r.start, k.start
            """,
            (start, end),
        ).fetchall()
    return [
        RawKernel(
            correlation_id=r[0], start=r[1], end=r[2], device=r[3], stream=r[4], demangled=r[5], mangled=r[6],
            short=r[7], grid=(r[8], r[9], r[10]), block=(r[11], r[12], r[13]), registers=r[14], static_smem=r[15],
            dynamic_smem=r[16], global_tid=r[17], api_start=r[18],
        )
        for r in rows
    ]


def raw_enclosing_ranges(conn: sqlite3.Connection, global_tid: int, t: int) -> list[tuple[int, int, str]]:
    """(start, end, text) of every push/pop range on the thread with start <= t <= end, outermost first."""
    return conn.execute(
        "SELECT n.start, n.end, COALESCE(n.text, s.value) FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId "
        "WHERE n.eventType = 59 AND n.globalTid = ? AND n.start <= ? AND n.end >= ? ORDER BY n.start, n.end DESC",
        (global_tid, t, t),
    ).fetchall()


SIZES = re.compile(r", sizes = (\[.*?\]), input_op_ids = ")  # an emit_nvtx range's input shapes


def raw_innermost_sizes(db: Path, raw: list[RawKernel]) -> list[str | None]:
    """Per launch, the `sizes` field of the innermost enclosing NVTX range that has one (the launching call)."""
    out = []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        for k in raw:
            found = [m.group(1) for _, _, text in raw_enclosing_ranges(conn, k.global_tid, k.api_start)
                     if (m := SIZES.search(text))]
            out.append(found[-1] if found else None)
    return out


# ---------------------------------------------------------------------------------------------------------------
# ncu report


@dataclass
class RawAction:
    """One profiled kernel of an ncu report, read straight from `ncu_report`."""

    index: int
    demangled: str
    mangled: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    values: dict[str, tuple[float, str]] = field(default_factory=dict)

    @property
    def config(self) -> tuple[str, tuple[int, int, int], tuple[int, int, int]]:
        """(demangled name, grid, block)."""
        return (self.demangled, self.grid, self.block)


def raw_ncu_actions(report_path: Path, metric_names: list[str]) -> list[RawAction]:
    """Every action of every range, in report order, with (value, unit) of each named metric it returned.

    Read in a child process: ncu_report and torch must never share one (see plugins/ncu/reader.py).
    """
    proc = subprocess.run(
        [sys.executable, __file__, "ncu", str(report_path), json.dumps(metric_names)],
        capture_output=True, text=True, check=True, timeout=300,
    )
    return [
        RawAction(**{**a, "grid": tuple(a["grid"]), "block": tuple(a["block"]),
                     "values": {k: tuple(v) for k, v in a["values"].items()}})
        for a in json.loads(proc.stdout)
    ]


def _raw_ncu_actions_here(report_path: Path, metric_names: list[str]) -> list[RawAction]:
    import ncu_report

    report = ncu_report.load_report(str(report_path))
    actions: list[RawAction] = []
    for r in range(report.num_ranges()):
        rng = report.range_by_idx(r)
        for i in range(rng.num_actions()):
            action = rng.action_by_idx(i)

            def dims(prefix: str, action: Any = action) -> tuple[int, int, int]:
                x, y, z = (int(action.metric_by_name(f"{prefix}_{axis}").as_uint64()) for axis in "xyz")
                return (x, y, z)

            values = {}
            for name in metric_names:
                metric = action.metric_by_name(name)
                if metric is not None and metric.has_value() and metric.as_string() is None:
                    values[name] = (metric.as_double(), metric.unit())
            actions.append(
                RawAction(
                    index=len(actions),
                    demangled=action.name(ncu_report.IAction.NameBase_DEMANGLED),
                    mangled=action.name(ncu_report.IAction.NameBase_MANGLED),
                    grid=dims("launch__grid_dim"),
                    block=dims("launch__block_dim"),
                    values=values,
                )
            )
    return actions


def match_in_launch_order(actions: list[RawAction], kernels: list[RawKernel]) -> list[int]:
    """Launch index each ncu action profiled: the next launch, after the previous match, of the same config.

    Raises AssertionError when an action matches no later launch (the captures disagree).
    """
    matched: list[int] = []
    position = 0
    for action in actions:
        j = next((j for j in range(position, len(kernels)) if kernels[j].config == action.config), None)
        assert j is not None, f"ncu action {action.index} {action.demangled[:60]!r} matches no later nsys launch"
        matched.append(j)
        position = j + 1
    return matched


# ---------------------------------------------------------------------------------------------------------------
# Kineto trace


@dataclass
class RawTrace:
    """A Kineto chrome trace, numbers parsed as exact decimals (microseconds)."""

    events: list[dict[str, Any]]

    def of(self, *cats: str) -> list[dict[str, Any]]:
        """Complete ('X') events of the given categories."""
        return [e for e in self.events if e.get("ph") == "X" and e.get("cat") in cats]

    @property
    def launches(self) -> dict[int, dict[str, Any]]:
        """Runtime/driver call by correlation id."""
        return {int(e["args"]["correlation"]): e for e in self.of("cuda_runtime", "cuda_driver")}

    @property
    def ops_by_external_id(self) -> dict[int, dict[str, Any]]:
        """cpu_op event by External id (unique in these traces)."""
        ops = self.of("cpu_op")
        table = {int(e["args"]["External id"]): e for e in ops}
        assert len(table) == len(ops), "External ids of cpu_op events are not unique"
        return table

    def kernels_in_launch_order(self) -> list[dict[str, Any]]:
        """Kernel events sorted by the start of their launching call, then by their own start."""
        launches = self.launches
        return sorted(
            self.of("kernel"), key=lambda k: (launches[int(k["args"]["correlation"])]["ts"], k["ts"])
        )

    def measure(self) -> dict[str, Any]:
        """The CPU-side `operator_profiler::measure` range."""
        (event,) = [e for e in self.of("user_annotation") if e["name"] == MEASURE]
        return event


def raw_trace(path: Path) -> RawTrace:
    """Load a Kineto trace with exact decimal timestamps."""
    return RawTrace(json.loads(Path(path).read_text(encoding="utf-8"), parse_float=Decimal)["traceEvents"])


def ns(us: Decimal | int) -> int:
    """Exact nanoseconds of a Kineto microsecond value (3 decimals)."""
    value = Decimal(us) * 1000
    assert value == value.to_integral_value(), us
    return int(value)


def enclosing(events: list[dict[str, Any]], tid: int, t: Decimal) -> list[dict[str, Any]]:
    """Events on thread `tid` whose [ts, ts + dur] holds t, outermost first."""
    hits = [e for e in events if e["tid"] == tid and e["ts"] <= t <= e["ts"] + e["dur"]]
    return sorted(hits, key=lambda e: (e["ts"], -e["dur"]))


# A PyTorch operator name: `aten::mm`, `torch::autograd::AccumulateGrad` (a namespace, no spaces).
OP_NAME = re.compile(r"^[A-Za-z_]\w*(::\w+)+$")


def is_op_name(name: str) -> bool:
    """True for a namespaced operator (not the measure marker)."""
    return bool(OP_NAME.match(name)) and name != MEASURE


# ---------------------------------------------------------------------------------------------------------------
# Inductor generated code


_SOURCE_NODES = re.compile(r"# Topologically Sorted Source Nodes: \[([^\]]*)\]")
_TRITON_RUN = re.compile(r"^\s+(\w+)\.run\(")
_EXTERN = re.compile(r"^\s+(?:\w+ = )?extern_kernels\.(\w+)\(")


def raw_call_sites(pass_dir: Path) -> list[tuple[str, str, list[str]]]:
    """(kind 'triton' | 'extern', name, source FX nodes) of each launch in the generated call(), in call order.

    Reads the one generated wrapper module (the one defining `call`) among the modules the pass recorded (a pass
    that compiled also recorded each Triton kernel's module); the source nodes are those of the comment Inductor
    writes above each call.
    """
    index = json.loads((pass_dir / "inductor_provenance.json").read_text(encoding="utf-8"))
    (code,) = [c for c in index["generated_code"] if "def call(self, args)" in (pass_dir / c).read_text("utf-8")]
    sites: list[tuple[str, str, list[str]]] = []
    nodes: list[str] = []
    in_call = False
    for line in (pass_dir / code).read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("def call(self, args)"):
            in_call = True
        if not in_call:
            continue
        comment = _SOURCE_NODES.search(line)
        if comment:
            nodes = [n.strip() for n in comment.group(1).split(",") if n.strip()]
        elif match := _TRITON_RUN.match(line):
            sites.append(("triton", match.group(1), nodes))
        elif match := _EXTERN.match(line):
            sites.append(("extern", f"aten::{match.group(1)}", nodes))
    return sites


def raw_node_modules(pass_dir: Path) -> dict[str, str]:
    """FX node name -> nn.Module path the harness recorded."""
    index = json.loads((pass_dir / "inductor_provenance.json").read_text(encoding="utf-8"))
    return {node: entry["module_path"] for node, entry in index["node_modules"].items()}


if __name__ == "__main__" and sys.argv[1:2] == ["ncu"]:
    print(json.dumps([asdict(a) for a in _raw_ncu_actions_here(Path(sys.argv[2]), json.loads(sys.argv[3]))]))


def kernels_of(profile: OperatorAttributedProfile) -> list[KernelRecord]:
    """Every kernel of the profile (operators' and unattributed), by kernel_id."""
    kernels = [k for op in profile.operators for k in op.kernels] + profile.unattributed_kernels
    return sorted(kernels, key=lambda k: k.kernel_id)


def recorded_profile(name: str, directory: Path) -> OperatorAttributedProfile:
    """tests/fixtures/<name>.profile.json.xz (a profile.json recorded on a GPU), written out under `directory` and
    loaded as `analyze` would load it."""
    from mcp_server.schema.io import load_profile

    path = directory / f"{name}.json"
    path.write_bytes(lzma.decompress((FIXTURES / f"{name}.profile.json.xz").read_bytes()))
    return load_profile(path)
