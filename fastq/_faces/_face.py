"""What both faces are to their engine: its holder in the process that
started it, the one that may close it; a forked child's copy is refused
(it would take the parent's batches and slots) and closes nothing.

NOTE [ A face left open is closed before the interpreter's teardown ]

A face that is never closed is closed when it is garbage (``__del__``),
or, if it is still alive when the interpreter exits, by an exit handler,
while every module is whole. After the exit handlers the interpreter
tears its modules down, setting their globals to None, and a face still
alive then (a module global, a reference cycle, an exception's traceback)
is finalized there: a ``__del__`` that read a global then printed a
traceback at exit, as a DataLoader with persistent workers did in scripts
that import trainers. So every open face is closed by the exit handler,
and ``__del__`` reads no module global before it has found an engine left
to close, which in the teardown it never has. (``weakref.finalize`` would
hold the engine for the face, and the engine may reach the face back
through a worker's death raised from the loop: the face would never be
garbage.)
"""

from __future__ import annotations

import atexit
import contextlib
import os
import warnings
import weakref

from .._loop._engine import Engine, check_open


class Face:
    """A face over one engine; the subclass sets ``_engine`` and ``_pid``,
    then calls ``_opened()`` once its construction completes.
    ``_unclosed_warning``: what a face dropped or left open at exit
    without ``close()`` says, as a ResourceWarning (None: nothing)."""

    _engine: Engine
    _pid: int
    _closed = True  # until _opened()
    _unclosed_warning: str | None = None

    @property
    def closed(self) -> bool:
        # The engine closes itself on a fatal error (a worker's death).
        return self._closed or self._engine.closed

    def _check_open(self) -> None:
        check_open(self.closed, self._pid)

    def _opened(self) -> None:
        """Construction completed: from now on this face closes its engine,
        by ``close()``, when it is garbage, or at interpreter exit (NOTE [ A
        face left open is closed before the interpreter's teardown ])."""
        self._closed = False
        _open_faces.add(self)
        _close_open_faces_at_exit.install()

    def close(self) -> None:
        """Stops and reaps every worker (bounded: about a second). Batches
        already handed out stay valid while referenced."""
        # An engine closed already (by a fatal error, or at exit) needs
        # nothing more, and nothing here reads a module global then.
        if self._closed or self._engine.closed or os.getpid() != self._pid:
            return
        self._closed = True
        self._engine.close()

    def _close_left_open(self) -> None:
        """Closes a face nobody closed, in the process that started it
        only, first warning ``_unclosed_warning``, unless its last loop let
        go of it (NOTE [ A loop holds its face ] in fastq/_loop/_consumer.py):
        then it is closed where a `with` around the loop would close it."""
        if self._closed or self._engine.closed or os.getpid() != self._pid:
            return
        feed = self._engine.feed
        try:
            warning = self._unclosed_warning
            if warning is not None and (feed is None or not feed.released_by_loop):
                # 3: where the face was dropped, past __del__.
                warnings.warn(warning, ResourceWarning, stacklevel=3)
        finally:
            with contextlib.suppress(Exception):  # never raise from __del__
                self.close()

    def __del__(self) -> None:
        # NOTE [ A face left open is closed before the interpreter's
        # teardown ]: no module global is read before an engine is found
        # open, and in the teardown none is.
        if self._closed or self._engine.closed:
            return
        self._close_left_open()


# Faces of this process that may still be open, for the exit handler.
_open_faces: weakref.WeakSet[Face] = weakref.WeakSet()


class _ExitHook:
    """Closes every face still open when the interpreter exits, among the
    exit handlers (NOTE [ A face left open is closed before the
    interpreter's teardown ]). Registered with the first face, after the
    workers' own exit handler (fastq/_workers/_pool.py), so it runs first:
    atexit runs handlers last-registered first."""

    installed = False

    def install(self) -> None:
        if not self.installed:
            atexit.register(self)
            self.installed = True

    def __call__(self) -> None:
        for face in list(_open_faces):
            face._close_left_open()
            # A forked child's copy closes nothing, and says nothing later.
            face._closed = True


_close_open_faces_at_exit = _ExitHook()
