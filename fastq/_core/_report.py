"""Error reports: written by a worker into the slot of the failed batch and
read back by the consumer, so failures travel the data path, not a side
channel. Survives exceptions that cannot be pickled."""

from __future__ import annotations

import pickle
import traceback
from dataclasses import dataclass
from typing import Any

from ..errors import FastqError, SpecError, WorkerError

# The slot header's sample field when the failure was not at one sample (a
# whole-batch call, or before any sample).
UNKNOWN_SAMPLE = 0xFFFFFFFF


@dataclass
class Report:
    type_name: str
    message: str
    traceback: str
    is_spec_error: bool
    exception: bytes | None  # the pickled exception, when it pickles

    def revive(self) -> BaseException | None:
        """The original exception object, if it survives the round trip."""
        data = self.exception
        if data is None:
            return None
        try:
            exc = pickle.loads(data)
        except Exception:  # a class that cannot be rebuilt: text is enough
            return None
        return exc if isinstance(exc, BaseException) else None

    def error(
        self,
        *,
        worker: int,
        pid: int,
        where: str,
        task: int = -1,
        sample: int | None = None,
    ) -> FastqError:
        """What the consumer raises for this report: a SpecError for a
        batch that does not fit the spec, else a WorkerError with the
        remote traceback and the original exception as its cause."""
        if self.is_spec_error:
            return SpecError(f"{self.message} (worker {worker}, {where})")
        exc = WorkerError(
            f"worker {worker} (pid {pid}) raised {self.type_name} while producing "
            f"{where}: {self.message}\n\nRemote traceback:\n{self.traceback}",
            worker=worker,
            task=task,
            sample=sample,
            remote_traceback=self.traceback,
        )
        exc.__cause__ = self.revive()
        return exc


def encode(exc: BaseException, limit: int) -> bytes:
    """A report of `exc` in at most `limit` bytes (the slot's size)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        message = str(exc)
    except Exception:
        message = f"<{type(exc).__name__}: str() failed>"
    pickled: bytes | None
    try:
        pickled = pickle.dumps(exc)
        pickle.loads(pickled)  # classes whose __init__ needs other arguments
    except Exception:
        pickled = None
    report = Report(
        f"{type(exc).__module__}.{type(exc).__qualname__}",
        message,
        text,
        isinstance(exc, SpecError),
        pickled,
    )
    data = _dump(report)
    if len(data) > limit:
        report.exception = None
        data = _dump(report)
    while len(data) > limit and (report.traceback or report.message):
        # Keep the end of the traceback: it names the failing line.
        keep = max(0, len(report.traceback) - (len(data) - limit) - 64)
        report.traceback = "...\n" + report.traceback[-keep:] if keep else ""
        if not keep:
            report.message = report.message[: max(0, limit // 4)]
        data = _dump(report)
    return data[:limit]


def decode(data: Any) -> Report:
    try:
        fields = pickle.loads(bytes(data))
        return Report(**fields)
    except Exception as exc:
        return Report("unknown", f"unreadable error report ({exc})", "", False, None)


def _dump(report: Report) -> bytes:
    return pickle.dumps(report.__dict__, protocol=pickle.HIGHEST_PROTOCOL)
