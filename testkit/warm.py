"""A warm interpreter for the tests' command lines: `dvfs-mlops` and `mlflow` as separate processes, without paying
their imports every time.

A fresh `dvfs-mlops sweep` spends 5-6 s of CPU importing torch, transformers and mlflow before it does anything, and
the end-to-end tests start well over a hundred of them. `WarmInterpreter` starts one Python that imports all of that
once (the "zygote", as Android's app starter and Chromium's renderer starter call the pattern) and then forks a new
process for each command. A command is a shim script on PATH (`bin/dvfs-mlops`, `bin/mlflow`) that hands its
argv, environment, working directory, umask and its own stdin/stdout/stderr (SCM_RIGHTS) to the zygote over a Unix
socket, forwards the signals it gets to the forked process and exits as that process did (its exit code, or the same
signal). What a command imported that the zygote had not, the zygote imports before its next fork (library and
package modules only). The forked process runs the installed console script itself (`runpy.run_path`) with its own argv,
environment and working directory, and ends as a fresh interpreter does (threads joined, atexit handlers run,
buffers flushed; an uncaught exception is a traceback and exit code 1, an uncaught KeyboardInterrupt the SIGINT
exit). A shim killed with SIGKILL takes its process with it (the zygote's monitor sees the socket close).

What a warm command does not redo is its imports, so tests about the process itself keep starting a fresh one:
import-time warnings and the installed wheel (tests/test_packaging.py's installed loop), start-up time,
offline hub loading (its environment is read at import). A command whose environment differs from the zygote's in
a variable that libraries read at import time (`COLD_ENV`: Python's own, locale, torch/OpenMP threads, the Hugging
Face hub, tqdm, MLflow's logging set-up) is exec'd cold in the forked process, so it is exactly a fresh interpreter.

Run as `python -m testkit.warm SOCKET LOG`: the zygote (started by `WarmInterpreter.start`, never by hand).
"""
from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

# Imported by the zygote before it serves: the heavy roots the commands import lazily (then what the commands import
# beyond these, as they report it: `_report`, `_learn`).
PRELOAD = ("torch", "transformers", "transformers.models.bert.modeling_bert", "transformers.models.gpt_neox.modeling_gpt_neox",
           "transformers.models.auto.modeling_auto", "accelerate", "mlflow", "mlflow.cli", "mlflow.projects", "mlflow.pyfunc",
           "mlflow.store.tracking.sqlalchemy_store", "mlflow.store.model_registry.sqlalchemy_store",
           "mlflow.tracking", "optuna", "sqlalchemy", "alembic", "psycopg", "dvfs_mlops.app.cli")
COMMANDS = ("dvfs-mlops", "mlflow", "python")  # the venv's console scripts, and `python -m MODULE` / `python -c CODE`
# Environment variables read at import time by Python or the preloaded libraries (Python's PYTHON*, the locale of
# stdio, torch's and OpenMP's thread pools, huggingface_hub.constants, tqdm's envwrap defaults, mlflow/__init__.py's
# logging set-up): a command whose value differs from the zygote's starts cold.
COLD_ENV = re.compile(r"^(PYTHON|LANG$|LC_|HF_|HUGGINGFACE|TRANSFORMERS|TOKENIZERS|TORCH|PYTORCH|CUDA|OMP_|MKL_|KMP_|"
                      r"OPENBLAS|TQDM_|MLFLOW_CONFIGURE_LOGGING$|MLFLOW_LOGGING_LEVEL$|_MLFLOW_)")
_COLD = ""  # set when preloading started a thread: every command is exec'd cold from then on
# Set by the preloaded libraries themselves when imported (a test process that imported them passes them on): MLflow's
# telemetry session id (mlflow/telemetry), torch's inductor cache folder (torch/_inductor); neither is read at import.
SET_BY_IMPORTS = frozenset({"_MLFLOW_TELEMETRY_SESSION_ID", "TORCHINDUCTOR_CACHE_DIR"})
HEADER = 8  # bytes: the request's length, sent with its three file descriptors

SHIM = '''#!{python} -S
"""`{name}`, run by the warm interpreter at {socket} (testkit/warm.py)."""
import json, os, signal, socket, sys

pending = []
pid = None
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)


def forward(sig, frame):
    if pid is None:
        pending.append(sig)
    else:
        try:
            sock.sendall(b"sig %d\\n" % sig)
        except OSError:
            pass


for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, forward)
sock.connect({socket!r})
umask = os.umask(0)
os.umask(umask)
request = json.dumps({{"command": {name!r}, "argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd(),
                      "umask": umask}}).encode()
socket.send_fds(sock, [len(request).to_bytes({header}, "big")], [0, 1, 2])
sock.sendall(request)
reader = sock.makefile("rb")
line = reader.readline()
if not line.startswith(b"pid "):
    sys.stderr.write("warm interpreter: no process started (see {log})\\n")
    sys.exit(1)
pid = int(line.split()[1])
for s in pending:
    forward(s, None)
while True:
    line = reader.readline()
    if line.startswith(b"exit "):
        code = int(line.split()[1])
        break
    if not line:
        sys.stderr.write("warm interpreter: lost the process (see {log})\\n")
        sys.exit(1)
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
'''


class WarmInterpreter:
    """A zygote process and its shims: `bin` goes first on a command's PATH, `command(name)` is an argv prefix."""

    def __init__(self, folder: Path, proc: subprocess.Popen[bytes]):
        self.folder = folder
        self.bin = folder / "bin"
        self.proc = proc

    @classmethod
    def start(cls, folder: Path, timeout: float = 300) -> WarmInterpreter:
        """Start the zygote in `folder` (its socket, log and shims) and wait until it has imported everything.

        Raises:
            RuntimeError: the zygote exited or did not listen within `timeout` seconds (its log says why).
        """
        folder.mkdir(parents=True, exist_ok=True)
        sock, log = folder / "zygote.sock", folder / "zygote.log"
        (folder / "bin").mkdir(exist_ok=True)
        for name in COMMANDS:
            shim = folder / "bin" / name
            shim.write_text(SHIM.format(python=sys.executable, name=name, socket=str(sock), log=str(log), header=HEADER))
            shim.chmod(0o755)
        proc = subprocess.Popen([sys.executable, "-m", "testkit.warm", str(sock), str(log)], stdin=subprocess.DEVNULL,
                                stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True,
                                cwd=Path(__file__).resolve().parents[1])
        deadline = time.monotonic() + timeout
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"the warm interpreter did not start: {log.read_text()[-3000:]}")
            time.sleep(0.05)
        return cls(folder, proc)

    def command(self, name: str = "dvfs-mlops") -> list[str]:
        """The argv prefix that runs console script `name` warm."""
        return [str(self.bin / name)]

    @property
    def python(self) -> str:
        """An interpreter whose `-m MODULE ...` and `-c CODE ...` run warm (in place of `sys.executable`)."""
        return str(self.bin / "python")

    def path(self, rest: str | None = None) -> str:
        """A PATH whose `dvfs-mlops` and `mlflow` are the warm shims (for scripts and `mlflow run`), then the venv."""
        rest = os.environ["PATH"] if rest is None else rest
        return os.pathsep.join([str(self.bin), str(Path(sys.executable).parent), rest])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


# ---- the zygote ------------------------------------------------------------------------------------------------


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    head, fds, _flags, _addr = socket.recv_fds(conn, HEADER, 3)
    size = int.from_bytes(head, "big")
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ConnectionError("the shim went away mid-request")
        body += chunk
    return json.loads(body), fds


def _monitor(conn: socket.socket, fds: list[int]) -> bool:
    """In the forked monitor: fork the command's process; in the parent, relay signals and report its end.
    Returns True in the command's process; the monitor itself never returns."""
    pid = os.fork()
    if pid == 0:
        conn.close()
        return True
    for fd in fds:
        os.close(fd)
    with contextlib.suppress(OSError):
        conn.sendall(b"pid %d\n" % pid)
    pidfd = os.pidfd_open(pid)
    watched = [conn, pidfd]
    buffer = b""
    while True:
        ready, _, _ = select.select(watched, [], [])
        if pidfd in ready:
            break
        data = conn.recv(4096)
        if not data:  # the shim is gone (SIGKILL): so is its process, as a killed process would be
            os.kill(pid, signal.SIGKILL)
            watched = [pidfd]
            continue
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.startswith(b"sig "):
                os.kill(pid, int(line.split()[1]))
    _, status = os.waitpid(pid, 0)
    with contextlib.suppress(OSError):
        conn.sendall(b"exit %d\n" % os.waitstatus_to_exitcode(status))
    os._exit(0)


def _preload(names: list[str]) -> None:
    """Import `names` (what is not imported yet; one that fails is left to the commands), then freeze the heap."""
    import importlib
    import threading

    for name in names:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - an optional driver that is missing, a module only its package may import
            print(f"warm: not preloaded: {name}: {e!r}", file=sys.stderr, flush=True)
    if threading.active_count() != 1:  # forking a process with threads can leave their locks held in the child
        global _COLD
        _COLD = f"the preloaded modules started threads: {threading.enumerate()}"
        print(f"warm: every command starts cold from now on: {_COLD}", file=sys.stderr, flush=True)
    gc.freeze()  # Python docs, gc.freeze: "avoid copy-on-write in child processes" of a pre-fork server


def _learn(learned: Path, seen: int) -> int:
    """Preload what the commands so far imported beyond the zygote's modules (`_report`); returns the new offset."""
    try:
        with open(learned, "rb") as f:
            f.seek(seen)
            data = f.read()
    except FileNotFoundError:
        return seen
    done = data.rfind(b"\n") + 1  # whole lines only: a command may be writing one
    _preload(sorted(set(data[:done].decode().split())))
    return seen + done


def _serve(sock_path: str) -> tuple[dict, list[int]]:
    """Listen on `sock_path`; for each request fork a monitor. Returns (the request, its fds) in a command's process."""
    learned, seen = _learned_file(sock_path), 0
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path + ".tmp")
    listener.listen(64)
    listener.settimeout(1.0)
    os.rename(sock_path + ".tmp", sock_path)  # it exists: it is ready
    parent = os.getppid()
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:  # monitors that ended
                pass
        except ChildProcessError:
            pass
        if os.getppid() != parent:  # the test process is gone
            os._exit(0)
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        try:
            conn.settimeout(30)
            request, fds = _receive(conn)
            conn.settimeout(None)
        except (OSError, ValueError) as e:
            print(f"warm: bad request: {e!r}", file=sys.stderr, flush=True)
            conn.close()
            continue
        seen = _learn(learned, seen)
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            listener.close()
            if _monitor(conn, fds):
                return request, fds
        conn.close()
        for fd in fds:
            os.close(fd)


def _become(request: dict, fds: list[int], zygote_env: dict[str, str], learned: Path) -> None:
    """In the command's process: take the shim's stdio, directory, umask and environment, then run its command warm
    (or exec it cold where an import-time variable differs)."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    env = request["env"]
    os.environ.clear()
    os.environ.update(env)
    main = _entry(request["command"], request["argv"])
    cold = sorted(k for k in (set(env) | set(zygote_env)) - SET_BY_IMPORTS if COLD_ENV.match(k) and env.get(k) != zygote_env.get(k))
    why = _COLD or (f"{', '.join(cold)} differ" if cold else "") or ("not a form it runs warm" if main is None else "")
    with open(learned.with_name("commands.log"), "a") as log:  # what ran warm, what cold and why
        log.write(f"{'cold (' + why + ')' if why else 'warm'}: {request['command']} {' '.join(request['argv'])[:300]}\n")
    if why:
        script = [] if request["command"] == "python" else [str(Path(sys.executable).parent / request["command"])]
        os.execve(sys.executable, [sys.executable, *script, *request["argv"]], env)
    if "numpy" in sys.modules:  # numpy's global generator was seeded in the zygote (Python's `random` reseeds at fork)
        sys.modules["numpy"].random.seed()
    gc.enable()
    before = set(sys.modules)
    code = _run_as_main(main)
    _report(before, learned)
    os._exit(code)


def _entry(command: str, args: list[str]) -> Callable[[], object] | None:
    """What runs `command args` as `__main__`, with sys.argv and sys.path[0] as that interpreter would have them
    (Python docs, "Command line and environment": `-c` argv[0] '-c' and path '', `-m` the module's file and the
    working directory, a script its own path and folder); None for a form it does not run warm (other options)."""
    import runpy

    if command != "python":
        script = str(Path(sys.executable).parent / command)  # the venv's console script
        sys.argv, sys.path[0] = [script, *args], str(Path(script).parent)
        return lambda: runpy.run_path(script, run_name="__main__")
    if len(args) >= 2 and args[0] == "-m":
        sys.argv, sys.path[0] = [args[1], *args[2:]], os.getcwd()  # runpy puts the module's file in argv[0]
        return lambda: runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    if len(args) >= 2 and args[0] == "-c":
        sys.argv, sys.path[0] = ["-c", *args[2:]], ""

        def run_code() -> None:
            import types

            module = types.ModuleType("__main__")
            sys.modules["__main__"] = module
            exec(compile(args[1], "<string>", "exec"), module.__dict__)  # noqa: S102 - what `python -c` does

        return run_code
    return None


def _learned_file(sock_path: str) -> Path:
    return Path(sock_path).with_name("learned.txt")


def _report(before: set[str], learned: Path) -> None:
    """Append the library and package modules this command imported that the zygote lacks (one line, O_APPEND):
    the zygote imports them before its next fork. Modules from elsewhere (a model's code loaded by MLflow from its
    artifacts, a test's script) are never preloaded."""
    import sysconfig

    paths = sysconfig.get_paths()
    roots = (*{paths[k] for k in ("purelib", "platlib", "stdlib", "platstdlib")}, str(Path(__file__).resolve().parents[1] / "dvfs_mlops"))
    new = []
    for name in set(sys.modules) - before:
        origin = getattr(getattr(sys.modules[name], "__spec__", None), "origin", None)
        if not (isinstance(origin, str) and origin.startswith(roots)) or not all(part.isidentifier() for part in name.split(".")):
            continue
        if origin.startswith(roots[-1]) and not name.startswith("dvfs_mlops."):  # MLflow loads a model's code as code_model_<id>
            continue
        new.append(name)
    if new:
        with open(learned, "a") as f:
            f.write(" ".join(sorted(new)) + "\n")


def _run_as_main(main: Callable[[], object]) -> int:
    """Run `main` (a script, module or code as `__main__`) and end as Python's own shutdown does (Python/pythonrun.c `handle_system_exit`,
    Python/pylifecycle.c `Py_FinalizeEx`): SystemExit's code (None 0, an int itself, anything else printed and 1), an
    uncaught exception's traceback and 1, an uncaught KeyboardInterrupt the SIGINT death; then non-daemon threads
    joined, atexit handlers run, stdio flushed. Returns the exit code. What it skips is the module teardown (its garbage
    collection of the zygote's whole heap costs seconds; the stores' SQLite files are committed, not journalled in WAL)."""
    import atexit
    import threading
    import traceback

    code, interrupted = 0, False
    try:
        main()
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        code, interrupted = 1, True
    except BaseException:  # noqa: BLE001 - what Python prints for any uncaught exception
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120  # Python's exit code when flushing stdout fails at shutdown
    if interrupted:  # Python/pylifecycle.c `_Py_HandleSystemExit`/`exit_sigint`: die of SIGINT, as the shell expects
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


def main(argv: list[str]) -> None:
    sock_path = argv[1]
    zygote_env = dict(os.environ)
    gc.disable()  # nothing to collect while importing; then freeze it all: the children's collections skip it
    _preload(list(PRELOAD))
    for stale in (sock_path, sock_path + ".tmp"):
        if os.path.lexists(stale):
            os.unlink(stale)
    request, fds = _serve(sock_path)
    _become(request, fds, zygote_env, _learned_file(sock_path))


if __name__ == "__main__":
    main(sys.argv)
