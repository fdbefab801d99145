"""The GPU's clocks while the window runs: nvidia-smi sampled every few milliseconds (never set; standard library)."""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
from typing import Any

QUERY = ["--query-gpu=clocks.sm,clocks.mem", "--format=csv,noheader,nounits", "-i", "0"]
EVERY_MS = 10


class ClockSampler:
    """Samples GPU 0's SM and memory clocks from `start()` to `stop()`; `summary()` gives min, median, max."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> ClockSampler:
        smi = shutil.which("nvidia-smi")
        if smi is None:
            return self
        self._proc = subprocess.Popen([smi, *QUERY, "-lms", str(EVERY_MS)], stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            try:
                self.samples.append((float(parts[0]), float(parts[1])))
            except (ValueError, IndexError):
                continue

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)

    def summary(self) -> dict[str, Any] | None:
        """{'sm_mhz': [min, median, max], 'memory_mhz': [...], 'samples': n}, or None without samples."""
        if not self.samples:
            return None
        sm, mem = [s for s, _ in self.samples], [m for _, m in self.samples]
        return {"sm_mhz": [min(sm), statistics.median(sm), max(sm)],
                "memory_mhz": [min(mem), statistics.median(mem), max(mem)], "samples": len(self.samples),
                "every_ms": EVERY_MS}
