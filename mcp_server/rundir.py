"""The run directory: every artifact path of every pass, the manifest, and the lock of the run writing it.

Capture writes raw artifacts and manifest.json here; profile.json and everything after it are derived from
these files alone. This module is the one place that knows where each file lies.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import re
import shutil
from collections.abc import Collection, Iterator
from datetime import datetime
from pathlib import Path
from typing import IO

from pydantic import ValidationError

from mcp_server.errors import ProfileFormatError, UsageError
from mcp_server.schema.io import write_model_atomic
from mcp_server.schema.manifest import RunManifest, RunOwner
from mcp_server.schema.types import MEMORY_PASS, SHARED_PASSES, PassName

MANIFEST = "manifest.json"
PROFILE = "profile.json"
ANALYSIS = "analysis"  # where `analyze` wrote by default, beside the profile, before it took fresh folders
RANKS = "ranks.json"
MEMORY, MEMORY_CHART = "memory.json", "memory_timeline.png"
BYTECODE_LOG = "bytecode.log"
MAP_BYTECODE_LOG = "bytecode.map.log"  # map's own: the capture's log stays what its manifest note names
RUN_ENTRIES = frozenset({*SHARED_PASSES, MANIFEST, PROFILE, ANALYSIS, RANKS, BYTECODE_LOG, MAP_BYTECODE_LOG,
                         MEMORY, MEMORY_CHART})
RANK_FOLDER = re.compile(r"^rank(\d+)$")
TORCHRUN_LOG = re.compile(r"^[a-z_]+\.torchrun\.log$")
RUNS_FOLDER = "op_runs"
RESERVE_ATTEMPTS = 50


class RunDir:
    """One run directory: `RunDir(path).manifest_path`, `.pass_dir("nsys")`, `.read_manifest()`, ..."""

    LOCK = ".run.lock"
    GPU_LOCK = ".gpu.lock"
    MARKERS = (GPU_LOCK, ".gpu.*-done", ".bytecode-done", ".window.json", ".write-test")  # a run's scratch files

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.interrupted: RunOwner | None = None  # the run before this one, when it was stopped before it finished

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # ----------------------------------------------------------------------------------------- top-level files

    @property
    def manifest_path(self) -> Path:
        """manifest.json: what ran, with which tools, options and artifacts."""
        return self.path / MANIFEST

    @property
    def profile_path(self) -> Path:
        """profile.json, assembled from the artifacts."""
        return self.path / PROFILE

    @property
    def bytecode_log(self) -> Path:
        """What the bytecode precompile beside the passes printed (where it ran)."""
        return self.path / BYTECODE_LOG

    @property
    def map_bytecode_log(self) -> Path:
        """What the bytecode precompile beside `map`'s ncu pass printed (where it ran)."""
        return self.path / MAP_BYTECODE_LOG

    # ----------------------------------------------------------------------------------------- per pass

    def pass_dir(self, name: PassName) -> Path:
        """The folder of pass `name`."""
        return self.path / name

    def harness_result(self, name: PassName) -> Path:
        """The harness's result (environment, window times, errors) of pass `name`."""
        return self.pass_dir(name) / "harness.json"

    def output_log(self, name: PassName) -> Path:
        """Everything the child of pass `name` printed."""
        return self.pass_dir(name) / "output.log"

    def kineto_trace(self, name: PassName = "torch") -> Path:
        """The torch.profiler pass's Kineto trace."""
        return self.pass_dir(name) / "kineto_trace.json"

    def provenance(self, name: PassName) -> Path:
        """Inductor's provenance of a compiled pass (its generated code lies beside it)."""
        return self.pass_dir(name) / "inductor_provenance.json"

    def nsys_report_base(self) -> Path:
        """What nsys's --output is given (it appends .nsys-rep)."""
        return self.pass_dir("nsys") / "report"

    def nsys_report(self) -> Path:
        """nsys's report."""
        return self.pass_dir("nsys") / "report.nsys-rep"

    def nsys_sqlite(self) -> Path:
        """nsys's report exported to SQLite: the timeline every later stage reads."""
        return self.pass_dir("nsys") / "report.sqlite"

    def export_log(self) -> Path:
        """What `nsys export` printed."""
        return self.pass_dir("nsys") / "export.log"

    def ncu_report_base(self, name: PassName = "ncu") -> Path:
        """What ncu's --export is given (it appends .ncu-rep)."""
        return self.pass_dir(name) / "report"

    def replay_calls(self, name: PassName) -> Path:
        """The module calls a shape-variant pass profiles (JSON, written once the replay plan is known)."""
        return self.pass_dir(name) / "replay_calls.json"

    def ncu_report(self, name: PassName = "ncu") -> Path:
        """ncu's report of pass `name` (ncu, or ncu_variants)."""
        return self.pass_dir(name) / "report.ncu-rep"

    def attach_log(self, name: PassName) -> Path:
        """What the ncu that attached to a waiting pass printed."""
        return self.pass_dir(name) / "attach.log"

    def memory_snapshot(self, start: bool = False) -> Path:
        """The memory pass's pickled allocator snapshot after its window (or at its failure); with `start`, the one
        its trace starts from."""
        return self.pass_dir(MEMORY_PASS) / ("snapshot_start.pickle" if start else "snapshot.pickle")

    def memory_record(self) -> Path:
        """What the memory pass's harness recorded beside the allocator (operators, modules, phases, tensors)."""
        return self.pass_dir(MEMORY_PASS) / "memory_record.json"

    @property
    def memory_path(self) -> Path:
        """memory.json, rebuilt from the memory pass's snapshots and record."""
        return self.path / MEMORY

    @property
    def memory_chart(self) -> Path:
        """The memory timeline chart beside memory.json."""
        return self.path / MEMORY_CHART

    def relative(self, path: Path) -> str:
        """An artifact's path as the manifest lists it: relative to the run directory."""
        return Path(path).relative_to(self.path).as_posix()

    # ----------------------------------------------------------------------------------------- ranks

    def rank_dir(self, rank: int | str) -> RunDir:
        """The run directory of one rank of a multi-rank run (`rank<R>/`); `rank_dir("%q{RANK}")` is the
        template each rank's harness expands itself."""
        return RunDir(self.path / f"rank{rank}")

    def ranks(self) -> list[int]:
        """The ranks whose run directories lie here (empty for a single-process run)."""
        found = (RANK_FOLDER.match(p.name) for p in self.path.iterdir()) if self.path.is_dir() else iter(())
        return sorted(int(m.group(1)) for m in found if m and (self.path / m.group(0) / MANIFEST).is_file())

    @property
    def ranks_path(self) -> Path:
        """ranks.json: the merged view of a multi-rank run."""
        return self.path / RANKS

    def torchrun_log(self, name: PassName) -> Path:
        """Everything torchrun and the ranks of pass `name` printed."""
        return self.path / f"{name}.torchrun.log"

    # ----------------------------------------------------------------------------------------- the GPU's turns

    @property
    def gpu_lock(self) -> Path:
        """The lock file the passes of one run take in turn (shared to build and warm up, exclusive to measure)."""
        return self.path / self.GPU_LOCK

    @property
    def bytecode_done(self) -> Path:
        """The file the bytecode precompile writes once it has ended; the timing pass's window waits for it."""
        return self.path / ".bytecode-done"

    def window_done(self, name: PassName) -> Path:
        """The file pass `name` writes once its window is done; the next pass waits for it."""
        return self.path / f".gpu.{name}-done"

    # ----------------------------------------------------------------------------------------- manifest

    def read_manifest(self) -> RunManifest:
        """manifest.json, validated (a version 1.0 manifest is upgraded on the way)."""
        if not self.manifest_path.is_file():
            raise ProfileFormatError(
                f"{self.path} is not a run directory (no {MANIFEST})",
                "pass a directory written by `operator-profiler profile`",
            )
        try:
            return RunManifest.model_validate(json.loads(self.manifest_path.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, ValidationError, RecursionError, UnicodeDecodeError) as exc:
            raise ProfileFormatError(
                f"{self.manifest_path} is corrupt: {str(exc).splitlines()[0]}", "re-run the capture"
            ) from exc

    def write_manifest(self, manifest: RunManifest) -> None:
        """Atomically write manifest.json."""
        write_model_atomic(self.manifest_path, manifest)

    @contextlib.contextmanager
    def updating_manifest(self) -> Iterator[RunManifest]:
        """Read the manifest, let the caller change it, write it back atomically (nothing when the body raises)."""
        manifest = self.read_manifest()
        yield manifest
        self.write_manifest(manifest)

    # ----------------------------------------------------------------------------------------- the directory

    def prepare(self) -> RunDir:
        """Create the directory (or accept an existing one) and check it can be written."""
        path = self.path = self.path.resolve()
        if path.exists() and not path.is_dir():
            raise UsageError(f"output path exists and is not a directory: {path}", "pass an output directory path")
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / ".write-test"
            probe.write_text("ok")
            probe.unlink()
        except OSError as exc:
            raise UsageError(
                f"cannot write to output directory {path}: {exc.strerror or exc}",
                "pass an output directory you can write to",
            ) from exc
        return self

    def claimable(self, workload: Path, pass_folders: Collection[str]) -> list[Path]:
        """The entries a capture of `workload` would clear here: none for an empty or new directory; a previous
        run of the same workload (its passes, manifest, profile and analysis), or the partial files of a run
        stopped before it wrote its manifest. `pass_folders` are the backends' main passes (the registry's), besides
        the passes every backend shares. A directory holding another workload's run, or files that belong to no run,
        is refused (a UsageError), before anything is written into it."""
        if self.in_use():
            raise UsageError(f"{self.path} is in use by another run", "wait for it to finish, or pass another --output")
        return self._clearable(workload, pass_folders)

    def _clearable(self, workload: Path, pass_folders: Collection[str]) -> list[Path]:
        entries = [p for p in self.path.iterdir() if not p.name.startswith(".")] if self.path.is_dir() else []
        if not entries:
            return []
        strangers = sorted(p.name for p in entries if not (p.name in pass_folders or is_run_entry(p.name)))
        if not self.manifest_path.is_file() and (strangers or self.owner() is None):
            raise UsageError(f"output directory {self.path} is not empty and holds no run",
                             "pass a new or empty directory as the output")
        if self.manifest_path.is_file():
            try:
                previous = self.read_manifest().workload
            except ProfileFormatError:
                previous = "an unreadable manifest"
            if previous != str(Path(workload).resolve()):
                raise UsageError(f"output directory {self.path} holds a run of {previous}",
                                 "pass another output directory, or remove that one first")
        if strangers:
            raise UsageError(f"output directory {self.path} holds files of no run: {', '.join(strangers[:5])}",
                             "pass another output directory, or move those files away")
        return entries

    def claim(self, workload: Path, pass_folders: Collection[str]) -> RunDir:
        """Make the directory this capture's own (`claimable` says what that clears), so nothing stale stays
        beside the new manifest. Called with the directory's lock held."""
        entries = self._clearable(workload, pass_folders)
        if not entries:
            return self.prepare()
        for entry in entries:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        return self.prepare()

    @contextlib.contextmanager
    def locked(self, owner: RunOwner | None = None) -> Iterator[RunDir]:
        """Hold the run directory for one run writing it; a second run into it at the same time is refused.

        While held, the lock file records `owner`, and the record is cleared when the body ends: a record found
        on taking the lock is a run that was stopped before it finished (`interrupted`)."""
        handle: IO[str] = open(self.path / self.LOCK, "a+")  # noqa: SIM115 - held for the body, closed below
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            handle.close()
            raise UsageError(
                f"{self.path} is in use by another run", "wait for it to finish, or pass another --output"
            ) from exc
        try:
            self.interrupted = self.owner()
            if owner is not None:
                handle.seek(0)
                handle.truncate()
                handle.write(owner.model_dump_json() + "\n")
                handle.flush()
            yield self
        finally:
            with contextlib.suppress(OSError):
                handle.truncate(0)
            handle.close()

    def in_use(self) -> bool:
        """Whether a run holds the directory's lock now (without creating the lock file)."""
        try:
            handle = open(self.path / self.LOCK)  # noqa: SIM115 - closed below
        except OSError:
            return False
        with handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            return False

    def owner(self) -> RunOwner | None:
        """The run recorded in the lock file: the one writing the directory now, or one stopped before it finished
        (None when the record is empty; a record that cannot be read stands for an unknown run)."""
        try:
            text = (self.path / self.LOCK).read_text(encoding="utf-8").strip()
        except OSError:
            return None
        if not text:
            return None
        try:
            return RunOwner.model_validate_json(text)
        except ValidationError:
            return RunOwner(pid=0, tag="", verb="unknown", started_at="unknown")

    def scratch_files(self) -> list[Path]:
        """A run's scratch files here: its GPU turns' markers and the temporary files of interrupted writes."""
        found = [p for pattern in self.MARKERS for p in self.path.glob(pattern)]
        return found + [p for p in self.path.rglob("*.tmp") if p.is_file()]

    @classmethod
    def existing(cls, path: Path) -> RunDir:
        """The run directory at `path` (or holding the profile.json or manifest.json at `path`)."""
        path = Path(path)
        if path.is_file() and path.name in (PROFILE, MANIFEST):
            path = path.parent
        if not (path / MANIFEST).is_file():
            raise ProfileFormatError(
                f"{path} is not a run directory (no {MANIFEST})", "pass the run directory a `profile` call wrote"
            )
        return cls(path.resolve())

    def files(self) -> list[str]:
        """Every regular file of the run (not the lock files), as sorted absolute paths."""
        return files_under(self.path)


def is_run_entry(name: str) -> bool:
    """Whether a run directory's entry `name` is one a capture writes whatever its backend (a backend's own main
    pass is the registry's to name: `claimable`'s `pass_folders`)."""
    return name in RUN_ENTRIES or bool(RANK_FOLDER.match(name) or TORCHRUN_LOG.match(name))


def files_under(folder: Path) -> list[str]:
    """Every regular file below `folder` but the hidden bookkeeping ones, as sorted absolute paths."""
    return sorted(str(p) for p in Path(folder).rglob("*") if p.is_file() and not p.name.startswith("."))


def profile_file(path: Path) -> Path:
    """A profile.json, given either its path or the run directory holding it."""
    path = Path(path)
    if path.is_dir():
        first = next((path / f"rank{r}" / PROFILE for r in RunDir(path).ranks()), None)
        if not (path / PROFILE).is_file() and first is not None and first.is_file():
            return first  # a multi-rank run: its first rank's profile stands for the run (ranks.json beside it)
        if not (path / PROFILE).is_file():
            raise ProfileFormatError(
                f"{path} holds no {PROFILE}",
                "run `assemble` on it if it is a run directory, or pass the profile.json a `profile` call returned",
            )
        return path / PROFILE
    if not path.is_file():
        raise ProfileFormatError(f"profile not found: {path}", "pass a profile.json or the run directory holding it")
    return path


def fresh_name(name_from: Path, suffix: str | None = None) -> str:
    """`<name>[-suffix]-<YYYYmmdd-HHMMSS>` for a new folder under op_runs/."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(name_from).stem) + (f"-{suffix}" if suffix else "")
    return f"{stem}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def claim_fresh_dir(project: Path, name_from: Path, suffix: str | None = None) -> Path:
    """Create and return `<project>/op_runs/<name>[-suffix]-<time>[-N]`, never a folder another run holds:
    creating it with exist_ok=False claims it, so two runs in the same second get two folders."""
    base = Path(project) / RUNS_FOLDER
    name = fresh_name(name_from, suffix)
    for n in range(1, RESERVE_ATTEMPTS + 1):
        candidate = base / (name if n == 1 else f"{name}-{n}")
        try:
            candidate.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            continue
        except OSError as exc:
            raise UsageError(
                f"cannot write to output directory {candidate}: {exc.strerror or exc}",
                "pass an output directory you can write to",
            ) from exc
        return candidate
    raise UsageError(f"could not claim a fresh directory under {base}", "pass an output directory explicitly")


def output_folder(output: Path | None, project: Path, name_from: Path, suffix: str | None = None) -> Path:
    """The caller's output folder (created), or a fresh one under `<project>/op_runs`."""
    if output is None:
        return claim_fresh_dir(project, name_from, suffix)
    return RunDir(Path(output)).prepare().path


@contextlib.contextmanager
def dropped_if_empty(folder: Path) -> Iterator[Path]:
    """Remove `folder` again when the work inside fails before writing anything into it."""
    try:
        yield folder
    except BaseException:
        with contextlib.suppress(OSError):
            folder.rmdir()  # only succeeds when empty
        raise
