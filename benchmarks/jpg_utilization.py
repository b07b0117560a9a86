"""`nvidia-smi dmon`'s JPEG-engine utilization (its jpg% column), sampled
in the background while a benchmark runs, and averaged over a window of
it afterwards. Where nvidia-smi is missing, or its dmon has no jpg
column, every window says why instead of a figure."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any


def parse_dmon(lines: Iterable[str], day_start: float) -> list[tuple[float, float]]:
    """(time, jpg%) of each sample in ``nvidia-smi dmon -s u -o T``'s
    output, the first GPU's; ``day_start`` is the epoch time of the local
    midnight its HH:MM:SS stamps count from. Samples whose jpg% is "-"
    (not reported) are left out."""
    names: list[str] = []
    out: list[tuple[float, float]] = []
    for line in lines:
        fields = line.split()
        if not fields:
            continue
        if fields[0].startswith("#"):
            # The first header names the columns ("#Time gpu sm ... jpg");
            # the second gives their units.
            head = [f.lstrip("#").lower() for f in fields if f != "#"]
            if "gpu" in head and not names:
                names = head
            continue
        if not names or "jpg" not in names or len(fields) != len(names):
            continue
        row = dict(zip(names, fields))
        if row.get("gpu") not in (None, "0"):
            continue
        value = row["jpg"]
        if not value.replace(".", "", 1).isdigit():
            continue
        h, m, s = (int(x) for x in row["time"].split(":"))
        out.append((day_start + 3600 * h + 60 * m + s, float(value)))
    return out


def window_mean(
    samples: Sequence[tuple[float, float]], start: float, end: float
) -> tuple[float | None, int]:
    """The mean jpg% of the samples of the window and how many. A sample
    averages about the second before its stamp, which is truncated to the
    second: those stamped within (start + 0.5, end + 0.5] are the window's
    (mostly inside it). A window shorter than that takes the first sample
    after its start."""
    inside = [v for t, v in samples if start + 0.5 < t <= end + 0.5]
    if not inside:
        inside = [v for t, v in samples if t > start][:1]
    if not inside:
        return None, 0
    return sum(inside) / len(inside), len(inside)


class JpgSampler:
    """``nvidia-smi dmon -s u -d 1 -o T`` in the background; ``window()``
    gives the mean jpg% between two ``time.time()`` stamps, once
    ``settle()`` has waited for the last of them."""

    def __init__(self) -> None:
        self.why_not: str | None = None
        self._lines: list[str] = []
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        lt = time.localtime()
        self._day_start = time.mktime(
            (lt.tm_year, lt.tm_mon, lt.tm_mday, 0, 0, 0, 0, 0, lt.tm_isdst)
        )

    def start(self) -> JpgSampler:
        smi = shutil.which("nvidia-smi")
        if smi is None:
            self.why_not = "nvidia-smi is not on PATH"
            return self
        # Line-buffered where stdbuf exists: a pipe would otherwise hold the
        # samples back in blocks (the stamps are theirs, so nothing is lost).
        cmd = [smi, "dmon", "-s", "u", "-d", "1", "-o", "T"]
        if shutil.which("stdbuf"):
            cmd = ["stdbuf", "-oL", *cmd]
        self._proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.append(line)

    def window(self, start: float, end: float) -> dict[str, Any]:
        """{"jpg_percent", "jpg_samples"} over [start, end], or
        {"jpg_percent": None, "jpg_why": ...}."""
        if self.why_not is not None:
            return {"jpg_percent": None, "jpg_samples": 0, "jpg_why": self.why_not}
        samples = parse_dmon(list(self._lines), self._day_start)
        if not samples:
            head = "".join(self._lines[:3]).strip() or "no output"
            return {
                "jpg_percent": None,
                "jpg_samples": 0,
                "jpg_why": f"nvidia-smi dmon gave no jpg column ({head[:160]})",
            }
        mean, count = window_mean(samples, start, end)
        return {"jpg_percent": mean, "jpg_samples": count}

    def settle(self, end: float) -> None:
        """Waits (2 s at most) for the sample of ``end``'s second: dmon
        prints it about a second later. Call once, after the last window."""
        deadline = time.time() + 2.0
        while self.why_not is None and time.time() < deadline and not self._covers(end):
            time.sleep(0.1)

    def _covers(self, end: float) -> bool:
        samples = parse_dmon(list(self._lines), self._day_start)
        return bool(samples) and samples[-1][0] >= end + 1

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._reader is not None:
            self._reader.join(5)
