"""The backend registry: one object per profiler backend, read by auto, preflight, the pass plan, capture and
assemble.

A third backend is written here as the adapter skeleton it would need (what it lacks, which passes it plans, how
preflight checks it, how it runs its main pass, how its run directory assembles) and registered for the test alone:
every reader picks it up from that one entry.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from mcp_server.backends.registry import (
    AUTO,
    REGISTRY,
    assemble,
    backend_choices,
    captured_by,
    choose_backend,
    pass_folders,
)
from mcp_server.capture.passes import Cancel, CapturingBackend
from mcp_server.capture.plan import plan_passes
from mcp_server.capture.request import CaptureRequest
from mcp_server.capture.schedule import capture
from mcp_server.errors import BackendUnavailable, ProfileFormatError, UsageError
from mcp_server.preflight import format_report, preflight
from mcp_server.progress import Progress
from mcp_server.render.repro import profile_command
from mcp_server.rundir import RunDir
from mcp_server.schema.manifest import PassRecord, RunManifest
from mcp_server.schema.profile import CaptureMetadata, OperatorAttributedProfile, WindowTotals
from mcp_server.schema.results import PreflightCheck
from mcp_server.schema.types import SHARED_PASSES, CaptureBackend, PassName

FAKE_TOOL = "fake-profiler"


@dataclass(frozen=True)
class FakeBackend:
    """The adapter a third backend would write: its own name, manifest label and main pass, known to no module but
    this one and the registry it is entered in."""

    name: str = "fake"
    title: str = "fake profiler"
    label: CaptureBackend = "fake+tracer"
    profile_tool: str = "fake"
    main_pass: PassName = "fake_trace"
    counters: bool = False
    records_graph_captures: bool = False
    remedy: str = f"install {FAKE_TOOL}"
    preflight_needs: tuple[str, ...] = (FAKE_TOOL,)
    required_checks: tuple[str, ...] = (FAKE_TOOL,)
    preflight_line: str = "backend auto -> fake profiler"
    lacking: tuple[str, ...] = ()

    def missing(self) -> list[str]:
        """What the test says this machine lacks."""
        return list(self.lacking)

    def tools(self) -> dict[str, str | None]:
        """Its one tool, found when nothing is lacking."""
        return {FAKE_TOOL: None if self.lacking else "/opt/fake/bin/fake-profiler"}

    def tool_checks(self, quick: bool) -> list[PreflightCheck]:
        """Preflight's check of its tool."""
        path = self.tools()[FAKE_TOOL]
        return [PreflightCheck(name=FAKE_TOOL, ok=path is not None, detail=path or "not found", remedy=self.remedy)]

    def run_main(self, req: CaptureRequest, progress: Progress, cancel: Cancel) -> PassRecord:
        """Its main pass: a file in the pass's folder, where its profiler would write its trace."""
        folder = req.run_dir.path / self.main_pass
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "trace.fake").write_text(f"{req.workload.name}\n")
        progress(f"{self.title}: recorded {req.workload.name}")
        return PassRecord(name=self.main_pass, profiler=self.name, command=[FAKE_TOOL, str(req.workload)],
                          directory=self.main_pass, started_at="2026-12-01T00:00:01+00:00", wall_time_s=0.0,
                          exit_code=0, artifacts=[f"{self.main_pass}/trace.fake"])

    def run_ranks(self, req: CaptureRequest, ranks: list[int], progress: Progress,
                  cancel: Cancel) -> dict[int, PassRecord]:
        """Its main pass on every rank."""
        return {rank: self.run_main(req, progress, cancel) for rank in ranks}

    def assemble(self, run_dir: RunDir, manifest: RunManifest) -> OperatorAttributedProfile:
        """A profile of no operators, saying who assembled it."""
        meta = CaptureMetadata(
            tool=self.name, gpu_used=False, device_type="cpu", torch_version="2.11.0", python_version="3.12.3",
            python_executable=manifest.python, workload=manifest.workload, compile_mode=manifest.compile_mode,
            run_mode=manifest.run_mode, warmup_iters=manifest.warmup_iters, iters=manifest.iters, seed=manifest.seed,
            command_line=manifest.command_line, started_at=manifest.created_at, finished_at=manifest.created_at,
        )
        return OperatorAttributedProfile(capture_metadata=meta, window=WindowTotals(wall_time_ns=1_000),
                                         warnings=[f"assembled by {self.name} from {run_dir.path.name}"])


FAKE = FakeBackend()


@contextmanager
def _registered(backend: CapturingBackend) -> Iterator[None]:
    """`backend` registered first (the one `auto` prefers), the shipped ones after it, for one test."""
    shipped = dict(REGISTRY)
    REGISTRY.clear()
    REGISTRY.update({backend.name: backend, **shipped})
    try:
        yield
    finally:
        REGISTRY.clear()
        REGISTRY.update(shipped)


@pytest.fixture
def fake() -> Iterator[FakeBackend]:
    with _registered(FAKE):
        yield FAKE


@pytest.fixture
def fake_lacking() -> Iterator[FakeBackend]:
    lacking = FakeBackend(lacking=(FAKE_TOOL,))
    with _registered(lacking):
        yield lacking


def test_the_registry_names_the_backends_and_their_pass_folders():
    assert backend_choices() == (AUTO, *REGISTRY)
    for name, backend in REGISTRY.items():
        assert backend.name == name and backend.main_pass not in SHARED_PASSES
    assert pass_folders() == {b.main_pass for b in REGISTRY.values()}
    assert [b.profile_tool for b in REGISTRY.values()] == ["nsys", "torch_profiler"]  # what their profiles say


def test_a_registered_backend_is_accepted_by_every_face(fake: FakeBackend):
    """The schema names no backend: the request, the CLI's --backend and a run directory's pass folder accept the
    fake one while it is registered."""
    from mcp_server.cli import build_parser
    from mcp_server.schema.requests import Interpreter, ProfileRequest

    python = Interpreter(python=sys.executable, source="argument")
    assert ProfileRequest(workload=Path(__file__), python=python, project=Path(), backend="fake").backend == "fake"
    assert build_parser().parse_args(["profile", "w.py", "--backend", "fake"]).backend == "fake"
    assert fake.main_pass in pass_folders() and "fake" in backend_choices()


def test_a_run_directory_holding_a_registered_backends_pass_can_be_captured_again(fake: FakeBackend, tmp_path: Path):
    workload = Path(__file__).resolve().parent / "workloads" / "tiny_mlp.py"
    req = CaptureRequest(workload=workload, run_dir=RunDir(tmp_path / "run"))
    capture(req, fake, ["operator-profiler", "profile", "tiny_mlp.py"], lambda _: None)
    assert sorted(p.name for p in req.run_dir.claimable(workload, pass_folders())) == [fake.main_pass, "manifest.json"]
    with pytest.raises(UsageError, match=f"holds files of no run: {fake.main_pass}"):
        req.run_dir.claimable(workload, frozenset())  # a folder no registered backend writes is not the run's


def test_an_unregistered_backend_is_refused_naming_the_registered_ones():
    with pytest.raises(BackendUnavailable, match="unknown backend 'fake'") as raised:
        choose_backend("fake")
    assert raised.value.remedy == f"choose one of {', '.join(backend_choices())}"


def test_auto_prefers_the_first_registered_backend_this_machine_has_everything_for(fake: FakeBackend):
    assert choose_backend(AUTO) is fake
    assert choose_backend("fake") is fake


def test_a_backend_lacking_something_is_skipped_by_auto_and_refused_by_name(fake_lacking: FakeBackend):
    assert choose_backend(AUTO) is not fake_lacking
    with pytest.raises(BackendUnavailable, match=f"backend fake needs {FAKE_TOOL}, not found here") as raised:
        choose_backend("fake")
    assert raised.value.remedy == fake_lacking.remedy


def test_preflight_checks_the_registered_backend_and_chooses_it(fake: FakeBackend):
    report = preflight(sys.executable, quick=True)
    assert report.backend == "fake"
    check = next(c for c in report.checks if c.name == FAKE_TOOL)
    assert check.ok and check.required
    assert not any(c.required for c in report.checks if c.name in ("nsys", "ncu"))
    assert format_report(report).splitlines()[-1] == fake.preflight_line


def test_preflight_falls_back_when_the_registered_backend_lacks_its_tool(fake_lacking: FakeBackend):
    report = preflight(sys.executable, quick=True)
    assert report.backend != "fake"
    assert not next(c for c in report.checks if c.name == FAKE_TOOL).required


def test_the_pass_plan_reads_the_backend(fake: FakeBackend):
    plan = plan_passes(fake, counters=True, whole_window=True, timing=True, compile_mode="eager", warmup_iters=3,
                       precompiling=False)
    assert [p.name for p in plan] == ["timing", fake.main_pass]  # no counter pass: the backend has none
    assert not any(p.record_graph_capture for p in plan)


def test_assemble_dispatches_to_the_backend_whose_main_pass_the_run_holds(fake: FakeBackend, tmp_path: Path):
    run_dir = RunDir(tmp_path / "run")
    run_dir.path.mkdir()
    manifest = RunManifest(
        created_at="2026-12-01T00:00:00+00:00", workload="w.py", python=sys.executable, backend=fake.label,
        compile_mode="eager", run_mode="inference", warmup_iters=1, iters=1, seed=0,
        command_line=["operator-profiler", "profile", "w.py", "--backend", "fake"],
        passes=[PassRecord(name=fake.main_pass, profiler="fake", command=["python", "harness.py"],
                           directory=fake.main_pass, started_at="2026-12-01T00:00:01+00:00", wall_time_s=1.0,
                           exit_code=0)])
    run_dir.write_manifest(manifest)
    assert captured_by(manifest) is fake
    assert assemble(run_dir).warnings == ["assembled by fake from run"]


def test_capture_runs_the_registered_backends_main_pass_and_assemble_reads_it_back(fake: FakeBackend,
                                                                                    tmp_path: Path):
    lines: list[str] = []
    req = CaptureRequest(workload=Path(__file__).resolve().parent / "workloads" / "tiny_mlp.py",
                         run_dir=RunDir(tmp_path / "run"))
    manifest = capture(req, choose_backend(AUTO), ["operator-profiler", "profile", "tiny_mlp.py"], lines.append)
    assert manifest.backend == fake.label and [p.name for p in manifest.passes] == [fake.main_pass]
    assert (tmp_path / "run" / fake.main_pass / "trace.fake").read_text() == "tiny_mlp.py\n"
    assert f"{fake.title}: recorded tiny_mlp.py" in "\n".join(lines)
    profile = assemble(req.run_dir)
    assert profile.warnings == ["assembled by fake from run"]
    rerun = profile_command(profile, req.run_dir.path, tmp_path, "capture again").argv
    assert rerun[1:2] == ["profile"] and rerun[3:5] == ["--backend", "fake"]  # no counters: not `run`
    for shipped, verb in (("nsys+ncu", "run"), ("torch_profiler", "profile")):
        meta = profile.capture_metadata.model_copy(update={"tool": shipped})
        argv = profile_command(profile.model_copy(update={"capture_metadata": meta}), req.run_dir.path, tmp_path,
                               "capture again").argv
        assert argv[1] == verb and ("--backend" in argv) == (verb == "profile")


def test_a_run_holding_no_backends_main_pass_is_refused(tmp_path: Path):
    manifest = RunManifest(created_at="2026-12-01T00:00:00+00:00", workload="w.py", python=sys.executable,
                           backend="memory", compile_mode="eager", run_mode="inference", warmup_iters=1, iters=1,
                           seed=0, command_line=["operator-profiler"])
    with pytest.raises(ProfileFormatError, match="holds no capture pass"):
        captured_by(manifest)
