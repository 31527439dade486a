"""Starting, talking to and killing the workers, from the judge's side.

As root (Gradescope, CI), a worker runs under ``unshare --mount --net --ipc --pid --fork
--mount-proc``: no network, its own PID namespace (every process it forks dies with it) and
its own mount namespace, in which ``launcher`` builds it a root from an allowlist (the system's
folders and Python's, read-only; ag's own install covered; small fresh scratch folders), then
drops to an unprivileged user in a cgroup (``cgroups``), with rlimits and a seccomp filter. Run
as a normal user (a student checking themselves), the same process split runs without those
privilege steps, and ``grade`` says so in one line.

The sandbox only isolates: a ``Worker`` writes the files it is given, binds read-only the folders
it is given, and hides the paths it is told to; the judge decides all three (``payload``).
"""
from __future__ import annotations

import base64
import functools
import itertools
import json
import os
import pwd
import shutil
import signal
import site
import socket
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from . import cgroups, channel

LAUNCHER = Path(__file__).with_name("launcher.py")
ADDRESS_SPACE = 3 * 2**30
SCRATCH_MOUNTS = (("/tmp", "size=256m,mode=1777"), ("/var/tmp", "size=16m,mode=1777"),
                  ("/dev/shm", "size=16m,mode=1777"), ("/run", "size=1m,mode=755"))  # /run: the host's sockets
SYSTEM_FOLDERS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
MEMORY = 3 * 2**30  # all of one worker's processes together (a cgroup); each alone: ADDRESS_SPACE
PROCESSES = 256
WORKER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
              "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class StudentError(Exception):
    """The student's side failed: its code raised, it died, hung, or sent what is not data."""


class SandboxError(RuntimeError):
    """The sandbox itself could not be built: no grade can be trusted, so grading stops."""


UNSHARE = ["unshare", "--mount", "--net", "--ipc", "--pid", "--fork", "--mount-proc", "--kill-child"]


@functools.lru_cache(maxsize=None)
def isolating() -> bool:
    """Full isolation as root, the process split only as a normal user. As root, the namespaces
    must work (a container whose seccomp forbids them does not): else no student code runs."""
    if os.geteuid() != 0:
        return False
    if shutil.which("unshare") is None:
        raise SandboxError("ag grade runs as root but finds no `unshare` (util-linux): it will not run "
                           "student code without isolation; install util-linux")
    tried = subprocess.run([*UNSHARE, "--", "true"], capture_output=True, text=True)
    if tried.returncode != 0:
        raise SandboxError("ag grade runs as root but cannot make the worker's namespaces here "
                           f"({tried.stderr.strip() or tried.returncode}): it will not run student code "
                           "without isolation; give the container CAP_SYS_ADMIN, or grade as a normal user "
                           "(isolation reduced)")
    return True


def worker_user(slot: int) -> tuple[int, int]:
    """The unprivileged user of parallel job ``slot`` (its own, so rlimits on processes are its own)."""
    name = "ag-grader" if slot == 0 else f"ag-grader{slot}"
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        created = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir",
                                  "/nonexistent", "--shell", "/usr/sbin/nologin", name],
                                 capture_output=True, text=True)
        if created.returncode not in (0, 9):  # 9: made meanwhile by another judge
            raise SandboxError(f"cannot create the worker user {name}: {created.stderr.strip()}")
        entry = pwd.getpwnam(name)
    return entry.pw_uid, entry.pw_gid


def covered(secrets) -> list[str]:
    """The paths to cover in the worker's root so that none of ``secrets`` shows: each secret
    that lies inside what the root holds (``allowed_paths``); or, where a secret holds what the
    worker needs to run (Python, its packages), its other children. Secrets outside the allowed
    paths are not in the root at all."""
    return list(_covered(tuple(str(s) for s in secrets)))


@functools.lru_cache(maxsize=8)
def _covered(secrets: tuple[str, ...]) -> tuple[str, ...]:
    """``covered``, worked out once for a submission's workers (they share its secrets)."""
    needed = _python_paths()
    allowed = [Path(p) for p in allowed_paths()]
    hidden = {c for path in secrets for c in _cover(Path(path).resolve(), needed)}
    return tuple(sorted(h for h in hidden if any(a == Path(h) or a in Path(h).parents for a in allowed)))


def _python_paths() -> list[Path]:
    """What the worker needs to run Python with NumPy: the prefixes and the site-packages."""
    return [Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.executable, *site.getsitepackages())]


def allowed_paths() -> list[str]:
    """What the worker's root holds: the system's folders and Python's (prefixes, site-packages),
    the outermost of each nest only."""
    python = {p if p.is_dir() else p.parent for p in _python_paths()}
    wanted = sorted({*map(Path, SYSTEM_FOLDERS), *python}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in wanted:
        if (path.exists() or path.is_symlink()) and not any(k in path.parents for k in kept if not k.is_symlink()):
            kept.append(path)
    return [str(p) for p in kept]


def _cover(path: Path, needed: list[Path]) -> list[str]:
    """``path``; or, when it holds what the worker needs to run (Python, its packages), its children."""
    if not path.exists() or path == Path("/") or path in needed:
        return []
    if not any(path in n.parents for n in needed):
        return [str(path)]
    return [c for child in sorted(path.iterdir()) for c in _cover(child, needed)]


class Worker:
    """One sandboxed worker: it gets ``files`` (bytes keyed by their path under the sandbox's root:
    ``lib/`` is on its ``sys.path``, ``submission/`` holds the student's files) and ``trees``
    (folders of the machine keyed the same way, bound read-only; copied without root), runs
    ``ag.course.worker`` with ``options`` and answers probes. It chooses nothing: the judge
    decides what it gets (``payload``) and which paths of the machine it must not see (``hide``).
    ``label`` names what it loads in the student's messages ("your ex3_online_softmax.py");
    each of its processes may map ``ADDRESS_SPACE`` bytes (the worker bounds itself tighter when
    ``options`` give it a ``headroom``)."""

    def __init__(self, files: dict[str, bytes], options: dict, *, label: str, timeout: float, slot: int = 0,
                 probes: int = 1, hide=(), trees: dict[str, str] | None = None) -> None:
        self.label, self.timeout = label, timeout
        self.isolate = isolating()
        self.config = self._config(files, options, slot, probes, hide)
        self.config["trees"] = dict(trees or {})
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.scratch: tempfile.TemporaryDirectory | None = None
        self.cgroups: list[Path] = []
        self.memory = cgroups.MemoryPeak([])

    def _config(self, files: dict[str, bytes], options: dict, slot: int, probes: int, hide) -> dict:
        """The launcher's configuration: plain JSON (the files in base64)."""
        limits = {"cpu": int(self.timeout * (probes + 1)) + 30, "address_space": ADDRESS_SPACE,
                  "file_size": 64 * 2**20, "open_files": 256, "core": 0}
        config = {"isolate": self.isolate, "limits": limits, "env": dict(WORKER_ENV), "python": sys.executable,
                  "hide": [], "root": "", "scratch": [], "allow": [], "cgroups": [], "worker": dict(options),
                  "files": {path: base64.b64encode(data).decode() for path, data in files.items()}}
        if self.isolate:
            config["uid"], config["gid"] = worker_user(slot)
            config["limits"]["processes"] = PROCESSES
            config["hide"] = covered(hide)
            config["scratch"] = [list(m) for m in SCRATCH_MOUNTS]
            config["allow"] = allowed_paths()
        return config

    def start(self) -> None:
        """Launch the worker and wait until it has imported the student's exercise."""
        _running.add(self)  # from here on, kill_all() reaches it
        config = dict(self.config)
        if not self.isolate:
            self.scratch = tempfile.TemporaryDirectory(prefix="ag-worker-")
            config["root"] = self.scratch.name
        else:
            self.cgroups = cgroups.make(f"{os.getpid()}-{next(_numbers)}", MEMORY, PROCESSES)
            self.memory = cgroups.MemoryPeak(self.cgroups)
            config["cgroups"] = [str(g / "cgroup.procs") for g in self.cgroups]
        judge_end, worker_end = socket.socketpair()
        command = [sys.executable, "-I", "-S", str(LAUNCHER), str(worker_end.fileno())]
        if self.isolate:
            command = [*UNSHARE, "--", *command]
        self.proc = subprocess.Popen(command, pass_fds=[worker_end.fileno()], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd="/",
                                     start_new_session=True)
        worker_end.close()
        self.sock = judge_end
        self._wait_until_ready(config)

    def _wait_until_ready(self, config: dict) -> None:
        try:
            _send_json(self.sock, config)
            hello = channel.receive(self.sock, timeout=self.timeout + 10)
        except (channel.ChannelError, OSError) as error:
            launcher_said = self._launcher_error()
            self.kill()
            if launcher_said:
                raise SandboxError(f"the worker's sandbox could not be built: {launcher_said}") from None
            raise StudentError(f"the exercise could not be loaded: {error}") from None
        self._stop_reading_stderr()
        if not (isinstance(hello, dict) and hello.get("ready") is True):
            self.kill()
            raise StudentError(f"importing {self.label} failed: {_described(hello)}")

    def memory_peak(self, reset: bool = False) -> int | None:
        """The most memory all the worker's processes held at once, in bytes, measured by its
        cgroup from outside (student code cannot fake it): since the worker started, or since
        the last ``memory_peak(reset=True)``, which starts a new count (and returns None).
        None without a cgroup (not root, or no writable cgroup file system)."""
        if reset:
            self.memory.reset()
            return None
        return self.memory.read()

    def call(self, probe: str, args, kwargs) -> object:
        """Run one probe in the worker; its result as data, or StudentError."""
        try:
            channel.send(self.sock, {"probe": probe, "args": list(args), "kwargs": dict(kwargs)})
            reply = channel.receive(self.sock, timeout=self.timeout)
        except channel.ChannelError as error:
            self.kill()
            if "in time" in str(error):
                raise StudentError(f"timed out after {self.timeout:g} s") from None
            raise StudentError(f"the worker running your code stopped: {error}") from None
        except OSError as error:
            self.kill()
            raise StudentError(f"the worker running your code stopped: {error}") from None
        if isinstance(reply, dict) and set(reply) == {"ok"}:
            return reply["ok"]
        if isinstance(reply, dict) and set(reply) == {"error"}:
            raise StudentError(_described(reply))
        self.kill()
        raise StudentError("the worker sent a reply that is not one")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def close(self) -> None:
        """Close the channel and end every process of the worker at once: its replies are all in,
        and nothing it would do on its way out (finalizers, ``atexit``) is waited for."""
        self.kill()

    def kill(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            if self.proc.poll() is None:
                children = _children(self.proc.pid)
                for pid in children:  # the namespace's PID 1: the kernel kills the rest
                    _signal(pid, signal.SIGKILL)
                if self.isolate and children:
                    _reaped(self.proc, 1.0)  # by unshare, so that the worker's CPU seconds are counted
                _signal(self.proc.pid, signal.SIGKILL)
            if not self.isolate:
                _signal(-self.proc.pid, signal.SIGKILL)  # its process group
            self.proc.wait()
            if self.proc.stderr:
                self.proc.stderr.close()
            self.proc = None
        if self.scratch is not None:
            self.scratch.cleanup()
            self.scratch = None
        self.memory.close()
        cgroups.remove(self.cgroups)
        self.cgroups = []
        _running.discard(self)

    def _launcher_error(self) -> str:
        """What unshare or the launcher printed if they failed before the student's code ran (the
        launcher sends its own output to /dev/null when it execs the worker, so student code
        never writes here)."""
        if self.proc is None or self.proc.stderr is None:
            return ""
        try:
            self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            return ""
        text = self.proc.stderr.read(4000).decode(errors="replace").strip()
        return text.splitlines()[-1] if text else ""

    def _stop_reading_stderr(self) -> None:
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
            self.proc.stderr = None


def _described(reply) -> str:
    error = reply.get("error") if isinstance(reply, dict) else None
    if not isinstance(error, dict):
        return "the worker sent no description"
    kind, message, where = (str(error.get(k, ""))[:400] for k in ("type", "message", "where"))
    return f"{kind}: {message}" + (f" ({where})" if where else "")


_numbers = itertools.count()
_running: set[Worker] = set()


def kill_all() -> None:
    """Kill every worker this process started and has not closed, and remove their cgroups
    (a judge told to stop, by SIGTERM, leaves nothing behind)."""
    for worker in list(_running):
        worker.kill()


def _send_json(sock: socket.socket, message: dict) -> None:
    """One plain JSON message: its length in 8 bytes, then the JSON (what ``launcher`` reads)."""
    data = json.dumps(message).encode()
    sock.sendall(struct.pack(">Q", len(data)) + data)


def _reaped(proc: subprocess.Popen, seconds: float) -> None:
    """Wait up to ``seconds`` for ``proc`` to exit."""
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        pass


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
