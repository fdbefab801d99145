"""On a GPU machine: SIGKILL the CLI in the middle of each pass of a run and check that no process of the run is left.

    python benchmarks/kill_check.py [--workload examples/conv_block/conv_block.py] [--out FILE.json]

For each case (the nsys pass of `run`, its ncu pass, the ncu pass under torchrun with two ranks when two GPUs are
visible), the CLI starts with a tag of this script's own in its environment, is killed with SIGKILL once its
progress names the pass, and every process carrying the tag (nsys, ncu, their targets, torchrun's ranks, compile
workers) must be gone 10 s later. The CPU test suite checks the same with the torch backend
(tests/test_faults.py::test_17...); nsys, ncu and torchrun start trees of their own, which only a GPU machine has.
Writes one JSON record per case (what was running when it was killed, what was left after 10 s) to --out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TAG = "OPERATOR_PROFILER_KILL_CHECK"
GRACE_S = 10.0


def tagged(tag: str) -> list[dict[str, object]]:
    """The processes whose environment carries this script's tag, with their command lines."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if f"{TAG}={tag}".encode() not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        found.append({"pid": int(entry.name), "command": command[:200]})
    return found


def one_case(name: str, argv: list[str], when: str, timeout_s: float) -> dict[str, object]:
    """Start the CLI, SIGKILL it once a progress line contains `when`, and look for what is left."""
    tag = uuid.uuid4().hex
    out = Path(tempfile.mkdtemp(prefix=f"kill_check_{name}_"))
    cli = [str(Path(sys.executable).with_name("operator-profiler")), *argv, "--output", str(out / "run")]
    proc = subprocess.Popen(cli, env={**os.environ, TAG: tag}, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            text=True)
    assert proc.stderr is not None
    seen, deadline = "", time.monotonic() + timeout_s
    for line in proc.stderr:
        if when in line:
            seen = line.strip()
            break
        if time.monotonic() > deadline:
            break
    time.sleep(2.0)  # well inside the pass
    running = tagged(tag)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(GRACE_S)
    left = tagged(tag)
    for entry in left:  # leave the machine clean whatever the verdict
        with contextlib.suppress(OSError):
            os.kill(int(str(entry["pid"])), signal.SIGKILL)
    return {"case": name, "killed_at": seen or f"(never saw {when!r})", "running_when_killed": running,
            "left_after_s": GRACE_S, "left": left, "ok": bool(seen) and not left}


def main() -> int:
    """Run every case that this machine can run; exit 1 when a process of a killed run was left."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default=str(REPO / "examples" / "conv_block" / "conv_block.py"))
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "measurements" / "kill_check.json")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for each pass to start")
    args = parser.parse_args()
    try:
        gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout.count("GPU ")
    except OSError:
        gpus = 0
    if gpus == 0:
        print("kill_check: no NVIDIA GPU here (nvidia-smi): the CPU suite checks the torch backend's case",
              file=sys.stderr)
        return 2
    cases = [("nsys_pass", ["run", args.workload], "nsys pass: "),
             ("ncu_pass", ["run", args.workload], "ncu pass: ")]
    if gpus >= 2:
        cases.append(("torchrun_ncu_pass", ["run", args.workload, "--nproc-per-node", "2"], "ncu pass"))
    results = [one_case(name, argv, when, args.timeout) for name, argv, when in cases]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"gpus": gpus, "cases": results}, indent=1) + "\n", encoding="utf-8")
    for result in results:
        print(f"{result['case']}: {'ok' if result['ok'] else 'LEFT ' + str(result['left'])}")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
