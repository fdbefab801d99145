"""Which stage of the `/optimize` loop is next, and why: every stage and checkpoint file of a workload's folder judged.

A checkpoint is `missing` when the file is absent; `stale` when it was computed from inputs that changed since;
`failed` when it is current but holds a failed verdict (validation_report.json that did not pass); else `done`.
Freshness comes from loop_state.json where a tool recorded the file (a recorded input whose sha256 differs from
the file now, or that is gone, makes it stale), and from modification times for the files the agents write, or a
recorded one that was rewritten since (an input newer than the file, by more than MTIME_SLACK_NS, makes it stale:
files written together by a checkout, an archive's extraction or a copy carry no order). A checkpoint is judged
against the inputs of its own stage and the stages before: a file a later stage writes (validate's bench.json)
is that stage's business. A stage that writes a file again (bench's validation_report.json) is done only when
that file was computed from the stage's first checkpoint (bench.json).

The next stage is the earliest one not done. A failed verdict sends the loop back to the stage that fixes it
(a failed validation: implement, which rewrites the optimized workload; once that changes, validation_report.json
is stale and validate is next again).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from mcp_server.errors import ProfileFormatError, WorkloadError
from mcp_server.loop.stages import RECORDED, STAGES, VALIDATION, Stage, file_name, first_writer, stage_index
from mcp_server.loop.state import fingerprint, read_state, state_path
from mcp_server.schema.io import read_model
from mcp_server.schema.loop import CheckpointRecord
from mcp_server.schema.proof import ValidationReport
from mcp_server.schema.results import LoopCheckpoint, LoopStage, LoopStatusResult
from mcp_server.schema.types import StageStatus

MTIME_SLACK_NS = 2_000_000_000


def _newer(path_ns: int | None, than_ns: int | None) -> bool:
    """Whether a file was modified after another by more than MTIME_SLACK_NS."""
    return (path_ns or 0) > (than_ns or 0) + MTIME_SLACK_NS


class _Folder:
    """The loop folder of one workload: its files' times and hashes (each read once) and their records."""

    def __init__(self, workload: Path) -> None:
        self.workload = workload
        self.path = workload.parent
        self.name = workload.stem
        state = read_state(self.path)
        self.state_file = state_path(self.path) if state is not None else None
        self.records = state.checkpoints if state is not None else {}
        self._hashes: dict[Path, str] = {}

    def file(self, template: str) -> Path:
        return self.path / file_name(template, self.name)

    def mtime(self, path: Path) -> int | None:
        return path.stat().st_mtime_ns if path.is_file() else None

    def fingerprint(self, path: Path) -> str:
        if path not in self._hashes:
            self._hashes[path] = fingerprint(path)
        return self._hashes[path]

    def record(self, template: str) -> CheckpointRecord | None:
        """The file's record in loop_state.json, when there is one and it still describes the file."""
        record = self.records.get(file_name(template, self.name))
        path = self.file(template)
        return record if record is not None and path.is_file() and self.fingerprint(path) == record.sha256 else None

    def later(self, index: int) -> set[str]:
        """The files first written by the stages after stage `index`."""
        return {file_name(t, self.name) for stage in STAGES[index + 1:] for t in stage.writes
                if first_writer(t) > index}


def _judge(folder: _Folder, index: int, template: str) -> tuple[StageStatus, str]:
    """A checkpoint at the stage that first writes it: its status and the one-line reason."""
    stage, name, path = STAGES[index], file_name(template, folder.name), folder.file(template)
    if not path.is_file():
        return "missing", f"{name} is missing"
    record = folder.record(template)
    if record is not None:
        later = folder.later(index)
        for source in record.inputs:
            if source.path in later:
                continue
            where = folder.path / source.path
            if not where.is_file():
                return "stale", f"{name} is stale: {source.path}, which {record.tool} read, is gone"
            if folder.fingerprint(where) != source.sha256:
                return "stale", f"{name} is stale: {source.path} changed since {record.tool} read it"
    else:
        written = folder.mtime(path) or 0
        before = [t for t in stage.writes[:stage.writes.index(template)] if t not in RECORDED]
        for source in (*stage.reads, *(before if template in RECORDED else ())):
            if source != template and _newer(folder.mtime(folder.file(source)), written):
                return "stale", f"{name} is stale: {file_name(source, folder.name)} is newer"
    if template == VALIDATION:
        try:
            report = read_model(path, ValidationReport, VALIDATION, "run validate again")
        except ProfileFormatError as exc:
            return "stale", f"{name} is unreadable ({exc.message}): validate writes it again"
        if not report.passed:
            return "failed", f"{name} did not pass (failed: {', '.join(report.failed_checks) or 'unknown'})"
    return "done", f"{name} is current"


def _judge_rewrite(folder: _Folder, stage: Stage, template: str) -> tuple[StageStatus, str]:
    """A file a later stage writes again (bench's validation_report.json): done once computed from the stage's
    first checkpoint."""
    name, path = file_name(template, folder.name), folder.file(template)
    first = folder.file(stage.writes[0])
    source = first.name
    if not path.is_file():
        return "missing", f"{name} is missing"
    if not first.is_file():
        return "missing", f"{name} (again, from {source})"
    record = folder.record(template)
    if record is not None:
        given = next((s for s in record.inputs if s.path == source), None)
        if given is None:
            return "stale", f"{name} was not written from {source}: run {record.tool} again with it"
        if folder.fingerprint(first) != given.sha256:
            return "stale", f"{name} is stale: {source} changed since {record.tool} read it"
    elif _newer(folder.mtime(first), folder.mtime(path)):
        return "stale", f"{name} is stale: {source} is newer (write it again from {source})"
    return "done", f"{name} is current (from {source})"


def _checkpoint(folder: _Folder, template: str, status: StageStatus, detail: str) -> LoopCheckpoint:
    path = folder.file(template)
    stored = folder.records.get(path.name)
    record = folder.record(template)
    mtime = folder.mtime(path)
    if stored is not None and record is None and mtime is not None:
        detail += f" (its loop_state.json record is of an earlier version, written by {stored.tool})"
    return LoopCheckpoint(
        file=path.name, path=str(path), stage=STAGES[first_writer(template)].name, status=status,
        provenance=None if mtime is None else "loop_state" if record is not None else "mtime",
        tool=record.tool if record is not None else None, written_at=record.written_at if record is not None else None,
        modified_at=None if mtime is None else datetime.fromtimestamp(mtime / 1e9, timezone.utc).isoformat(),
        detail=detail,
    )


def loop_status(workload: Path) -> LoopStatusResult:
    """Judge every stage and checkpoint file of the loop on `workload` (its folder holds the checkpoints); the
    next stage, the `--from=` value to resume with, and which files are reused and which written again."""
    workload = Path(workload).resolve()
    if not workload.is_file():
        raise WorkloadError(f"workload not found: {workload}", "pass the baseline workload .py file of the loop")
    folder = _Folder(workload)
    judged: dict[str, tuple[StageStatus, str]] = {}
    stages: list[LoopStage] = []
    per_stage: list[dict[str, StageStatus]] = []
    for index, stage in enumerate(STAGES):
        verdicts = {t: _judge(folder, index, t) if first_writer(t) == index else _judge_rewrite(folder, stage, t)
                    for t in stage.writes}
        judged.update({t: v for t, v in verdicts.items() if first_writer(t) == index})
        per_stage.append({file_name(t, folder.name): v[0] for t, v in verdicts.items()})
        wrong = [v for v in verdicts.values() if v[0] != "done"]
        writes = [file_name(t, folder.name) for t in stage.writes]
        stages.append(LoopStage(
            stage=stage.name, status=wrong[0][0] if wrong else "done",
            reads=[file_name(t, folder.name) for t in stage.reads], writes=writes,
            detail=_detail(wrong) if wrong else f"current: {', '.join(writes)}" if writes else "writes no checkpoint"))
    checkpoints = [_checkpoint(folder, t, *judged[t]) for t in judged]
    return _result(folder, stages, per_stage, checkpoints)


def _detail(wrong: list[tuple[StageStatus, str]]) -> str:
    """The reasons of a stage's files that are not done, in one line: the missing ones named together."""
    missing = [d.removesuffix(" is missing") for status, d in wrong if status == "missing"]
    parts: list[str] = []
    for status, detail in wrong:
        if status != "missing":
            parts.append(detail)
        elif missing:
            parts.append(f"missing: {', '.join(missing)}")
            missing = []
    return "; ".join(parts)


def _result(folder: _Folder, stages: list[LoopStage], per_stage: list[dict[str, StageStatus]],
            checkpoints: list[LoopCheckpoint]) -> LoopStatusResult:
    """The answer: the next stage, where to resume, why, and the files reused and written again."""
    pending = next((s for s in stages if s.status != "done"), None)
    resume = None
    if pending is None:
        reason = "every stage is done: the report and every file it was rendered from are current"
        summary = f"loop of {folder.workload.name} complete: {reason}"
    else:
        resume = STAGES[stage_index(pending.stage)].on_failure if pending.status == "failed" else pending.stage
        reason = pending.detail + (f"; fix it at {resume}" if resume != pending.stage else "")
        summary = f"next: {pending.stage} (--from={resume}): {reason}"
    start = stage_index(resume) if resume is not None else len(STAGES)
    fixing = pending is not None and pending.status == "failed"
    again: list[str] = []
    for index in range(start, len(STAGES)):
        for name, status in per_stage[index].items():
            if (index > start or fixing or status != "done") and name not in again:
                again.append(name)
    reused = [c.file for c in checkpoints if c.status == "done" and c.file not in again]
    return LoopStatusResult(
        workload=str(folder.workload), folder=str(folder.path),
        loop_state_path=str(folder.state_file) if folder.state_file is not None else None,
        next_stage=pending.stage if pending is not None else None, resume_from=resume, reason=reason,
        summary=summary, stages=stages, checkpoints=checkpoints, reused=reused, recompute=again,
    )
