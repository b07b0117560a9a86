"""What both faces are to their engine: its holder in the process that
started it, the one that may close it; a forked child's copy is refused
(it would take the parent's batches and slots) and closes nothing."""

from __future__ import annotations

import os

from .._loop._engine import Engine, check_open


class Face:
    """A face over one engine; the subclass sets ``_engine`` and ``_pid``,
    and ``_closed`` False once its construction completes."""

    _engine: Engine
    _pid: int
    _closed: bool

    @property
    def closed(self) -> bool:
        # The engine closes itself on a fatal error (a worker's death).
        return self._closed or self._engine.closed

    def _check_open(self) -> None:
        check_open(self.closed, self._pid)

    def close(self) -> None:
        """Stops and reaps every worker (bounded: about a second). Batches
        already handed out stay valid while referenced."""
        if self._closed or os.getpid() != self._pid:
            return
        self._closed = True
        self._engine.close()
