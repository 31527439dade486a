"""Starting, talking to and killing the workers, from the judge's side.

As root (Gradescope, CI), a worker runs under ``unshare --mount --net --ipc --pid --fork
--mount-proc``: no network, its own PID namespace (every process it forks dies with it) and
its own mount namespace, in which ``launcher`` builds it a root from an allowlist (the system's
folders and Python's, read-only; ag's own install covered; small fresh scratch folders), then
drops to an unprivileged user in a cgroup, with rlimits and a seccomp filter. Run as a normal user (a student checking themselves), the same
process split runs without those privilege steps, and ``grade`` says so in one line.
"""
from __future__ import annotations

import ast
import base64
import functools
import os
import pwd
import re
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import time
import itertools
from pathlib import Path

from . import channel
from .exercises import EXERCISES, PACKAGE, REPO

LAUNCHER = Path(__file__).with_name("launcher.py")
MAX_SUBMITTED_FILE = 2 * 2**20
ADDRESS_SPACE = 3 * 2**30
SCRATCH_MOUNTS = (("/tmp", "size=256m,mode=1777"), ("/var/tmp", "size=16m,mode=1777"),
                  ("/dev/shm", "size=16m,mode=1777"), ("/run", "size=1m,mode=755"))  # /run: the host's sockets
SYSTEM_FOLDERS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
CGROUPS = Path("/sys/fs/cgroup")
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


def probe_source(test_file: Path) -> str:
    """A public graded test file without its checks: the ``test_*`` functions are cut out, so the
    worker gets the probes and their helpers and never sees an assertion or an expected value;
    the imports only the checks used go too (pytest's import alone would cost each worker 0.15 s)."""
    lines = test_file.read_text().splitlines(keepends=True)
    checks = [n for n in ast.parse("".join(lines)).body
              if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name.lower().startswith("test")]
    _delete(lines, checks)
    tree = ast.parse("".join(lines))
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    unused = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
              and not any((a.asname or a.name).split(".")[0] in used for a in n.names)]
    _delete(lines, unused)
    return "".join(lines)


def _delete(lines: list[str], nodes) -> None:
    """Remove the nodes' lines (decorators included), last first so the line numbers hold."""
    for node in sorted(nodes, key=lambda n: n.lineno, reverse=True):
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
        del lines[start:node.end_lineno]


def exercise_of(test_file: Path):
    """The exercise a graded test file belongs to: the ``exN`` in its name."""
    match = re.search(r"ex(\d+)", test_file.stem)
    number = int(match.group(1)) if match else None
    for exercise in EXERCISES:
        if exercise.number == number:
            return exercise
    raise ValueError(f"graded test file {test_file.name} names no exercise: call it test_exN_... "
                     f"(N one of {', '.join(str(e.number) for e in EXERCISES)})")


def hidden_paths(tests: Path, submission: Path, extra=()) -> list[str]:
    """What the worker must not see: ag's source, the repository, the graded tests and the
    instructor's folder around them, the other submissions beside this one, and ``extra``."""
    tests, submission = tests.resolve(), submission.resolve()
    wanted = [PACKAGE, tests, submission.parent, Path(tempfile.gettempdir()), *map(Path, extra)]
    if (REPO / "pyproject.toml").exists():
        wanted.append(REPO)
    for folder in (tests.parent, tests.parent.parent):
        if any((folder / name).exists() for name in ("ag", "ag-src", "pyproject.toml", "solutions")):
            wanted.append(folder)
    needed = _python_paths()
    hidden = {c for path in wanted for c in _cover(Path(path).resolve(), needed)}
    fresh = [Path(p) for p, _ in SCRATCH_MOUNTS]  # the worker gets new, empty ones of these
    return sorted(h for h in hidden if not any(Path(h) == f or f in Path(h).parents for f in fresh))


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


def make_cgroup(name: str) -> list[Path]:
    """A new cgroup bounding the memory and the processes of everything one worker runs (cgroup v2,
    or v1's memory and pids hierarchies); [] where the cgroup file system cannot be written (some
    containers), where the rlimits still bound each process on its own."""
    made: list[Path] = []
    try:
        if (CGROUPS / "cgroup.controllers").exists():
            parent = CGROUPS / "ag-grade"
            parent.mkdir(exist_ok=True)
            for folder in (CGROUPS, parent):
                (folder / "cgroup.subtree_control").write_text("+memory +pids")
            made.append(parent / name)
            made[-1].mkdir()
            limits = {"memory.max": MEMORY, "memory.swap.max": 0, "pids.max": PROCESSES}
        else:
            for controller in ("memory", "pids"):
                made.append(CGROUPS / controller / "ag-grade" / name)
                made[-1].mkdir(parents=True)
            limits = {"memory.limit_in_bytes": MEMORY, "memory.memsw.limit_in_bytes": MEMORY, "pids.max": PROCESSES}
        for group in made:
            for file, value in limits.items():
                if (group / file).exists():
                    (group / file).write_text(str(value))
    except OSError:
        remove_cgroup(made)
        return []
    return made


def remove_cgroup(groups: list[Path]) -> None:
    for group in reversed(groups):
        for _ in range(50):  # its last processes may still be exiting
            try:
                group.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                for pid in (group / "cgroup.procs").read_text().split():
                    _signal(int(pid), signal.SIGKILL)
                time.sleep(0.02)


class Worker:
    """One sandboxed worker for one exercise of one submission."""

    def __init__(self, exercise, submission: Path, tests: Path, *, timeout: float, slot: int = 0,
                 probes: int = 1, hide=()) -> None:
        self.exercise, self.timeout = exercise, timeout
        self.isolate = isolating()
        self.config = self._config(exercise, Path(submission), Path(tests), slot, probes, hide)
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.scratch: tempfile.TemporaryDirectory | None = None
        self.cgroups: list[Path] = []

    def _config(self, exercise, submission: Path, tests: Path, slot: int, probes: int, hide) -> dict:
        from .assign import package_files
        files = {f"lib/{path}": data for path, data in package_files({exercise.number}).items()}
        for test_file in sorted(tests.glob(f"test_ex{exercise.number}_*.py")):
            files[f"lib/{test_file.name}"] = probe_source(test_file).encode()
        for helper in sorted(tests.glob("*.py")):  # public helpers the probes import (references.py)
            if not helper.name.startswith(("test_", "conftest")):
                files[f"lib/{helper.name}"] = helper.read_bytes()
        for mine in sorted(submission.glob("ex*.py")):
            if mine.is_file() and mine.stat().st_size <= MAX_SUBMITTED_FILE:
                files[f"submission/{mine.name}"] = mine.read_bytes()
        limits = {"cpu": int(self.timeout * (probes + 1)) + 30, "address_space": ADDRESS_SPACE,
                  "file_size": 64 * 2**20, "open_files": 256, "core": 0}
        config = {"isolate": self.isolate, "files": files, "limits": limits, "env": dict(WORKER_ENV),
                  "python": sys.executable, "hide": [], "root": "", "scratch": [], "allow": [], "cgroups": []}
        if self.isolate:
            config["uid"], config["gid"] = worker_user(slot)
            config["limits"]["processes"] = PROCESSES
            config["hide"] = hidden_paths(tests, submission, hide)
            config["scratch"] = [list(m) for m in SCRATCH_MOUNTS]
            config["allow"] = allowed_paths()
        config["worker"] = {"exercise": exercise.number}  # the launcher adds where the submission is
        return config

    def start(self) -> None:
        """Launch the worker and wait until it has imported the student's exercise."""
        config = dict(self.config)
        if not self.isolate:
            self.scratch = tempfile.TemporaryDirectory(prefix="ag-worker-")
            config["root"] = self.scratch.name
        else:
            self.cgroups = make_cgroup(f"{os.getpid()}-{next(_numbers)}")
            config["cgroups"] = [str(g / "cgroup.procs") for g in self.cgroups]
        config["files"] = {path: base64.b64encode(data).decode() for path, data in config["files"].items()}
        judge_end, worker_end = socket.socketpair()
        command = [sys.executable, "-I", "-S", str(LAUNCHER), str(worker_end.fileno())]
        if self.isolate:
            command = [*UNSHARE, "--", *command]
        self.proc = subprocess.Popen(command, pass_fds=[worker_end.fileno()], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd="/",
                                     start_new_session=True)
        worker_end.close()
        self.sock = judge_end
        channel.send(self.sock, config)
        try:
            hello = channel.receive(self.sock, timeout=self.timeout + 10)
        except channel.ChannelError as error:
            launcher_said = self._launcher_error()
            self.kill()
            if launcher_said:
                raise SandboxError(f"the worker's sandbox could not be built: {launcher_said}") from None
            raise StudentError(f"the exercise could not be loaded: {error}") from None
        self._stop_reading_stderr()
        if not (isinstance(hello, dict) and hello.get("ready") is True):
            self.kill()
            raise StudentError("importing your " + self.exercise.filename + " failed: " + _described(hello))

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
        """Close the channel (the worker exits), and make sure every process of it is gone."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass  # kill() below
        self.kill()

    def kill(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            if self.proc.poll() is None:
                for pid in _children(self.proc.pid):  # the namespace's PID 1: the kernel kills the rest
                    _signal(pid, signal.SIGKILL)
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
        remove_cgroup(self.cgroups)
        self.cgroups = []

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
