"""The zygote: a fork server forked from this process while that is safe, so
that workers share the pages of what the script imported (torch, numpy)
instead of importing it all again."""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import os
import signal
import socket
import stat
import sys
import threading
import types
import warnings
from multiprocessing import connection, forkserver, process, spawn, util
from multiprocessing import context as mp_context
from typing import Any, NoReturn

# numpy's BLAS pool starts its threads at import; they are counted in the
# baseline below (OpenBLAS stops them in a pthread_atfork handler, so a fork
# with them running is safe).
import numpy  # noqa: F401

try:
    from multiprocessing import popen_forkserver
except ImportError:  # no descriptor passing: no forkserver at all
    popen_forkserver = None  # type: ignore[assignment]

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def forkserver_preload() -> list[str]:
    """What a normal fork server preloads for fastq's workers (get_context's
    fallback, and the server multiprocessing starts if the zygote is gone):
    fastq and numpy through fastq._worker, and torch when this process has
    it. CPython (3.11 to 3.13 at least) never preloads "__main__" itself
    (ForkServer passes forkserver.main no main_path), so each worker runs
    the main script and would import torch with it every time workers start
    (each epoch without persistent_workers)."""
    torch = ["torch"] if "torch" in sys.modules else []
    return ["__main__", "fastq._worker", *torch]


# CPython's ForkServer attributes the zygote takes the place of (3.9-3.14;
# 3.14 adds _forkserver_authkey). A version without them gets no zygote.
_SERVER_ATTRS = ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid")


def _os_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0  # unknown: never safe


# Native threads (not Python's) running once fastq is imported: numpy's BLAS
# pool. Any more later, such as the OpenMP pool torch starts at its first
# parallel op (a forked child that uses it hangs) or a library's helper
# thread that may hold a lock, makes a fork unsafe.
_NATIVE_BASELINE = _os_threads() - threading.active_count()


class _State:
    """This process's zygote: a multiprocessing ForkServer whose server is
    the zygote (multiprocessing starts a normal one in its place if it dies)."""

    server: Any = None
    pending: _Pending | None = None  # forked early, not yet known to be ready
    failed = False  # one could not start here: the script will not change
    in_zygote = False  # this process is a zygote or one of its workers
    script_main: Any = None  # in the zygote: the script's __main__ module
    comm = b""  # in the zygote: the script's process name, for its workers


_state = _State()


def _forget_in_forked_child() -> None:
    """A forked child (the zygote itself, a fork worker, a helper the script
    forks) has no zygote: the parent's is not its child, and its copy of
    the "alive" pipe would keep that zygote up. A zygote's worker takes back
    the script's process name."""
    if _state.comm:
        _set_comm(_state.comm)
        _state.comm = b""
    server, pending = _state.server, _state.pending
    _state.server = _state.pending = None
    if server is not None and server._forkserver_alive_fd is not None:
        with contextlib.suppress(OSError):
            os.close(server._forkserver_alive_fd)
    if pending is not None:
        for fd in (pending.alive_w, pending.ready_r):
            with contextlib.suppress(OSError):
                os.close(fd)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_forked_child)


def cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        return bool(cuda is not None and cuda.is_initialized())
    except Exception:  # a torch build without CUDA support
        return False


def server_pid() -> int | None:
    """The pid of the process that forks this process's default-method
    workers (the zygote, or the normal fork server that replaced it), or
    None if there is none yet."""
    server = _state.server
    return None if server is None else server._forkserver_pid


def context() -> Any:
    """A forkserver context whose workers fork from the zygote, started now
    if none runs and a fork is safe; None where there can be no zygote (a
    thread, CUDA, not Linux, a multiprocessing this module does not know)."""
    if _state.server is None:
        pending, _state.pending = _state.pending, None
        if pending is None:
            if _state.failed or not _supported() or not _safe_to_fork():
                return None
            pending = _fork_zygote()
        _state.server = None if pending is None else pending.wait_ready()
        if _state.server is None:
            _state.failed = True
            return None
    return _CONTEXT


def start_early() -> None:
    """Forks the zygote now, while this process has one thread and no
    CUDA; the first workers that need it wait until it is ready. Called as
    ``fastq.torch`` is imported: by the time a loader starts its workers
    after CUDA, torch.distributed, accelerate or a trainer has usually
    started threads, and no zygote can be forked then."""
    if (
        _state.server is None
        and _state.pending is None
        and not _state.failed
        and cuda_possible()
        and _supported()
        and _safe_to_fork()
    ):
        _state.pending = _fork_zygote()
        if _state.pending is None:
            _state.failed = True


def cuda_possible() -> bool:
    """Whether CUDA may yet be initialised here: workers fork from this
    process until then (fastq._pool), so a zygote forked ahead serves only
    a torch built with CUDA, and costs a process elsewhere."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.backends.cuda.is_built())
    except AttributeError:  # a torch without the query: assume it may
        return True


def _supported() -> bool:
    if (
        not sys.platform.startswith("linux")
        or _state.in_zygote
        or popen_forkserver is None
        or not hasattr(os, "register_at_fork")
    ):
        return False
    launch = getattr(popen_forkserver.Popen, "_launch", None)
    names = getattr(getattr(launch, "__code__", None), "co_names", ())
    params = inspect.signature(forkserver.main).parameters
    required = [p for p in params.values() if p.default is inspect.Parameter.empty]
    server = forkserver.ForkServer()
    return (
        "connect_to_new_process" in names
        and len(required) == 3  # listener_fd, alive_r, preload
        and all(hasattr(server, a) for a in _SERVER_ATTRS)
        and hasattr(server, "_forkserver_authkey") == ("authkey_r" in params)
    )


def _safe_to_fork() -> bool:
    """One thread (Python's main one) besides the baseline, and no CUDA:
    nothing another thread holds, and nothing the child cannot use."""
    return (
        threading.current_thread() is threading.main_thread()
        and threading.active_count() == 1
        and 0 < _os_threads() <= 1 + _NATIVE_BASELINE
        and not getattr(process.current_process(), "_inheriting", False)
        and not cuda_initialised()
    )


# ------------------------------------------------------------ parent side


class _Pending:
    """A zygote forked and importing the main module: ``wait_ready`` turns
    it into a ForkServer that asks it for workers (None if it failed)."""

    def __init__(
        self, server: Any, pid: int, address: Any, alive_w: int, ready_r: int
    ) -> None:
        self.server = server
        self.pid = pid
        self.address = address
        self.alive_w = alive_w
        self.ready_r = ready_r

    def wait_ready(self) -> Any:
        ready = False
        try:
            # EOF instead of a byte: the zygote could not import the main
            # module, or it started threads; the normal fork server is used.
            ready = os.read(self.ready_r, 1) == b"1"
        except OSError:  # it died already
            pass
        finally:  # Ctrl+C while it starts too: no zygote is left behind
            os.close(self.ready_r)
            if not ready:
                os.kill(self.pid, signal.SIGKILL)  # harmless if it has exited
                os.close(self.alive_w)
                os.waitpid(self.pid, 0)
                if not util.is_abstract_socket_namespace(self.address):
                    os.unlink(self.address)
        if not ready:
            return None
        server = self.server
        server._forkserver_address = self.address
        server._forkserver_alive_fd = self.alive_w
        server._forkserver_pid = self.pid
        server._preload_modules = forkserver_preload()
        return server


def _fork_zygote() -> _Pending | None:
    """Forks the zygote, which then imports the main module on its own."""
    server: Any = forkserver.ForkServer()
    uses_authkey = hasattr(server, "_forkserver_authkey")
    listener = socket.socket(socket.AF_UNIX)
    opened: list[int] = []
    address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]
    try:
        listener.bind(address)
        if not util.is_abstract_socket_namespace(address):
            os.chmod(address, 0o600)
        listener.listen()
        listener_fd = listener.detach()
        opened.append(listener_fd)
        alive_r, alive_w = os.pipe()
        ready_r, ready_w = os.pipe()
        opened += [alive_r, alive_w, ready_r, ready_w]
        authkey_r = authkey_w = -1
        if uses_authkey:
            authkey_r, authkey_w = os.pipe()
            opened += [authkey_r, authkey_w]
        pid = _fork(listener_fd, alive_r, ready_w, authkey_r)
    except OSError:
        listener.close()
        for fd in opened:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(address)
        return None
    for fd in [listener_fd, alive_r, ready_w, authkey_r]:
        if fd >= 0:
            os.close(fd)
    pending = _Pending(server, pid, address, alive_w, ready_r)
    if uses_authkey:
        server._forkserver_authkey = os.urandom(32)
        try:
            os.write(authkey_w, server._forkserver_authkey)
        except OSError:  # it died already: wait_ready reads EOF
            pass
        finally:
            os.close(authkey_w)
    return pending


def _fork(listener_fd: int, alive_r: int, ready_w: int, authkey_r: int) -> int:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, OSError):
            stream.flush()  # else the zygote's workers would write it again
    parent = os.getpid()
    # Every signal blocked until the child has reset the handlers it
    # inherits: no handler of the script may run in the zygote.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        with warnings.catch_warnings():
            # Python 3.12+ warns of any second thread; the only ones here
            # are the baseline's, which a fork leaves in a usable state.
            warnings.filterwarnings(
                "ignore", message=".*multi-threaded.*", category=DeprecationWarning
            )
            pid = os.fork()
        if pid == 0:
            _zygote_main(parent, listener_fd, alive_r, ready_w, authkey_r, mask)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return pid


# ------------------------------------------------------------ zygote side


def _zygote_main(
    parent: int,
    listener_fd: int,
    alive_r: int,
    ready_w: int,
    authkey_r: int,
    mask: Any,
) -> NoReturn:
    code = 1
    try:
        _state.in_zygote = True
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is the consumer's
        _die_with(parent)
        _name_process(parent)
        _reset_signal_handlers()
        _release_inherited(keep={0, 1, 2, listener_fd, alive_r, ready_w, authkey_r})
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        _forget_parent_servers()
        _forget_unfinished_imports()
        _forget_script_main()
        # Otherwise exit without a word: the parent reads EOF and falls
        # back to the normal fork server.
        if threading.active_count() == 1 and _os_threads() == 1:
            os.write(ready_w, b"1")
            os.close(ready_w)
            kwargs = {"authkey_r": authkey_r} if authkey_r >= 0 else {}
            # multiprocessing's own server loop: it forks each worker, passes
            # descriptors and reports exit codes exactly as a normal fork
            # server does, and raises SystemExit once every client is gone.
            serve: Any = forkserver.main
            serve(listener_fd, alive_r, [], **kwargs)
    except SystemExit:
        code = 0
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)  # never the script's atexit handlers or finalizers


def _die_with(parent: int) -> None:
    """The kernel kills the zygote when the thread that forked it (the
    script's only one) exits, SIGKILL included; the workers, whose parent
    the zygote is, then die by their own PR_SET_PDEATHSIG."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(0)


def _set_comm(name: bytes) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)


def _name_process(parent: int) -> None:
    """`ps` shows "fastq-forkserver", not a second copy of the script's
    command line: the kernel reads that from the original argv strings,
    which Python keeps copies of and never reads again."""
    try:
        with open("/proc/self/comm", "rb") as f:
            _state.comm = f.read().strip()
    except OSError:
        pass
    _set_comm(b"fastq-zygote")
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end
    except (OSError, IndexError, ValueError):
        return
    size = end - start
    if not 0 < size < 1 << 20:
        return
    # The longest that fits; "forkserver" in it, as in multiprocessing's own
    # server's command line, for tools that look for that.
    for title in (f"fastq-forkserver (zygote of {parent})", "fastq-forkserver"):
        if len(title) < size:
            break
    else:
        title = "forkserver"[: size - 1]
    ctypes.memmove(start, title.encode().ljust(size, b"\0"), size)


def _reset_signal_handlers() -> None:
    for sig in signal.valid_signals():
        if sig == signal.SIGINT:
            continue
        try:
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass


def _release_inherited(keep: set[int]) -> None:
    """Points every inherited pipe, socket and unlinked file (a ring's memfd,
    a temporary file) at /dev/null: the zygote lives as long as the script,
    and its copies would keep a reader from seeing EOF, a peer from seeing
    a close, and memory or disk from being freed. The descriptor numbers
    stay taken, so that nothing the script's objects still name is reused;
    regular files, devices and the standard streams stay as they are."""
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd in keep or fd == null:
                continue
            try:
                st = os.fstat(fd)
            except OSError:  # the listing's own descriptor, closed by now
                continue
            mode = st.st_mode
            if (
                stat.S_ISFIFO(mode)
                or stat.S_ISSOCK(mode)
                or (stat.S_ISREG(mode) and st.st_nlink == 0)
            ):
                os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)


def _forget_parent_servers() -> None:
    """The zygote starts as a normal fork server does, with no fork server
    of its own, so its workers behave the same way."""
    fs: Any = forkserver._forkserver
    for name in (*_SERVER_ATTRS, "_forkserver_authkey", "_inherited_fds"):
        if hasattr(fs, name):
            setattr(fs, name, None)


def _forget_unfinished_imports() -> None:
    """A zygote forked early (from inside ``import fastq.torch``, itself
    perhaps inside the import of a module of the script's) inherits those
    modules half-executed, and their code never finishes here: a worker
    that needs one imports it afresh."""
    for name, module in list(sys.modules.items()):
        if getattr(getattr(module, "__spec__", None), "_initializing", False):
            del sys.modules[name]


def _forget_script_main() -> None:
    """The zygote and its workers never run the script's code: what a
    worker needs of the script's __main__ (a dataset class, a lambda)
    reaches it by value (fastq/_handoff.py), so the zygote holds an empty
    __main__ and its workers are started without the script's path
    (_SpawnWithoutMain). A script without a `__name__ == "__main__"`
    guard, as DataLoader's fork lets it be, is not run a second time in
    the background."""
    # No start method chosen yet, as in a new interpreter.
    default: Any = mp_context._default_context
    if hasattr(default, "_actual_context"):
        default._actual_context = None
    # The script's own module stays referenced: dropping it could finalize
    # what its globals hold, here.
    _state.script_main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")


# ------------------------------------------------------------ the context


class _ViaZygote:
    """What multiprocessing's forkserver Popen calls `forkserver`: that
    module, except that new processes are asked of this process's zygote."""

    def __getattr__(self, name: str) -> Any:
        return getattr(forkserver, name)

    @staticmethod
    def connect_to_new_process(fds: list[int]) -> tuple[int, int]:
        # In a forked child of the zygote's parent (which holds its context),
        # the zygote is not its own: the normal fork server serves it.
        server = _state.server or forkserver._forkserver
        result: tuple[int, int] = server.connect_to_new_process(fds)
        return result


class _SpawnWithoutMain:
    """What that launch calls `spawn`: that module, except that the
    preparation data names no main module for the worker to run (the
    zygote's workers never run the script: _forget_script_main)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(spawn, name)

    @staticmethod
    def get_preparation_data(name: str) -> dict[str, Any]:
        data: dict[str, Any] = spawn.get_preparation_data(name)
        data.pop("init_main_from_name", None)
        data.pop("init_main_from_path", None)
        return data


def _launch_via_zygote() -> Any:
    """multiprocessing's own forkserver launch (preparation data, pickling,
    descriptor passing, pid and exit code over the status pipe), unchanged
    but for the server it asks and the main module it names (none)."""
    if popen_forkserver is None:
        return None
    launch: Any = getattr(popen_forkserver.Popen, "_launch")  # noqa: B009
    scope = dict(vars(popen_forkserver))
    scope["forkserver"] = _ViaZygote()
    scope["spawn"] = _SpawnWithoutMain()
    return types.FunctionType(
        launch.__code__, scope, launch.__name__, launch.__defaults__, launch.__closure__
    )


if popen_forkserver is not None and hasattr(mp_context, "ForkServerContext"):

    class _Popen(popen_forkserver.Popen):
        _launch = _launch_via_zygote()

    class _Process(mp_context.ForkServerProcess):
        _start_method = "forkserver"

        @staticmethod
        def _Popen(process_obj: Any) -> Any:
            return _Popen(process_obj)

    class _Context(mp_context.ForkServerContext):
        """The forkserver start method, with the zygote as its server."""

        Process = _Process

    _CONTEXT: Any = _Context()
else:  # pragma: no cover - no forkserver here
    _CONTEXT = None
