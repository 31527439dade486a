"""The red team: hostile submissions that `ag grade` must score 0 on their exercise, and survive.

Each case copies solutions/ and makes ONE exercise file hostile (tests/redteam/payloads.py
holds the hostile code; case 22 needs two files): exiting "successfully", calling or stealing
the library's own solution, patching the assertions, returning values equal to anything,
leaking the hidden tests, rewriting the tests, ag or results.json, leaving processes behind,
looping, hogging memory or disk, reaching the network or a host's Unix socket, flooding the
output, faking results, Markdown in the results, pickles that run code in the judge, killing
the judge, IPC objects and keys that outlive the worker (and smuggle a solution from one
worker to the next), replies that blow up in the judge. The hostile file starts from the
student's stub (exercises/), so only the attack could earn points; the exits start from the
solution, so that the exit alone must cost them. Every case grades its submission once
through the CLI (``python -m ag grade DIR --json OUT --timeout 10``) and then checks, at once:

- the grading finished, results.json is the judge's, valid and under 1 MB;
- every test of the attacked exercise (hidden ones included) is "failed" with score 0, and
  every other test "passed" with full marks;
- nothing is left behind: no process whose command line holds the attack's token, no file
  named after it, no file under tests/grading or ag/ that mentions it;
- what the attack itself was after did not happen (see each case's ``check``).

Cases whose defence is isolation that only root can set up (namespaces, a hidden or
read-only filesystem) skip when not run as root; CI runs as root, so there they run.
Safety: the network case talks to 127.0.0.1 only (and the socket case to a socket the test
makes in /run), memory is capped at 6 GiB and the disk filler at 2 GiB per place; every
process an attack starts carries its token in argv and is killed by token when the case ends;
its files, IPC objects and keys are removed, and what it appended to the repository's files
is cut out again, whatever the grader did.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from ag import course

from redteam import payloads as P  # tests/redteam/payloads.py (pytest puts tests/ on sys.path)

REPO = Path(__file__).resolve().parents[1]
GRADING = REPO / "tests" / "grading"
HIDDEN = GRADING / "hidden"
SOLUTIONS = REPO / "solutions"
EXERCISES = {e.number: e for e in course.EXERCISES}
TIMEOUT = 10  # the grader's --timeout: ex1's lecture chain needs 1-2 s of it
DEADLINE = 300  # the whole grading of one submission
MAX_RESULTS_BYTES = 1 << 20
JUDGE_MEMORY = 512 << 20  # the most the judge may use, whatever a submission sends (it idles near 100 MB)
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
HOME = str(Path.home())
try:  # what one worker process may map; a submission's processes together should hold no more
    from ag.course.sandbox import ADDRESS_SPACE
except ImportError:
    ADDRESS_SPACE = 3 << 30
HOG_PROCESSES = ADDRESS_SPACE // (1 << 30) + 1  # 1 GiB each: together more than one process may


# ---- reading results ----

def exercise_of(name: str) -> int | None:
    """The exercise a graded test belongs to, from the part of its name before ':'
    ("ex3_online_softmax: ...", or the old grader's "test_ex3_online_softmax: ...", "test_hidden_ex3: ...")."""
    prefix = name.split(":")[0]
    for e in course.EXERCISES:
        if e.module_name in prefix:
            return e.number
    match = re.search(r"ex(\d+)(?!\d)", prefix)
    return int(match.group(1)) if match else None


def graded_test_functions() -> dict[str, int]:
    """Every graded test function (hidden ones included) and its exercise, read from the files."""
    found = {}
    for path in sorted(GRADING.rglob("test_*.py")):
        number = exercise_of(path.stem)
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                found[node.name] = number
    return found


def hidden_lines() -> set[str]:
    """The hidden tests' lines, stripped, of 12 characters or more, that appear in no public
    graded test, exercise or solution file."""
    public = set()
    for path in [*GRADING.glob("*.py"), *(REPO / "exercises").glob("*.py"), *SOLUTIONS.glob("*.py")]:
        public.update(line.strip() for line in path.read_text().splitlines())
    return {line.strip() for path in HIDDEN.rglob("*.py") for line in path.read_text().splitlines()
            if len(line.strip()) >= 12 and line.strip() not in public}


def strings_in(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in strings_in(k) + strings_in(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings_in(v)]
    return []


def fake_report_lines() -> tuple[list[str], dict]:
    """What the CLI would print, and results.json would hold, if exercise 1 had passed: its
    per-test lines (under today's and the new test names) and a perfect score."""
    tests, points = [], {}
    for path in sorted(GRADING.glob("test_ex1_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                for d in node.decorator_list:
                    if isinstance(d, ast.Call) and getattr(d.func, "attr", "") == "points":
                        points[node.name] = float(d.args[0].value)
    total = 68.0
    lines = []
    for name, pts in points.items():
        for prefix in (f"test_{EXERCISES[1].module_name}", EXERCISES[1].module_name):
            lines.append(f"{'passed':>6}  {pts:4g}/{pts:<4g} {prefix}: {name}")
            tests.append({"name": f"{prefix}: {name}", "score": pts, "max_score": pts, "status": "passed",
                          "output": "", "visibility": "visible"})
    lines.append(f"score: {total:g} / {total:g}")
    return lines, {"score": total, "max_score": total, "execution_time": 1.0, "visibility": "visible",
                   "stdout_visibility": "hidden", "tests": tests}


# ---- what an attack knows, and what it leaves ----

@dataclass
class Context:
    token: str
    root: Path  # the case's tmp_path
    port: int = 0

    @property
    def submission(self) -> Path:  # named so: the tamper payload only bites in the red team's runs
        return self.root / "redteam-submission"

    @property
    def results(self) -> Path:
        return self.root / "out" / "results.json"

    @property
    def judge_cwd(self) -> Path:
        return self.root / "judge"

    @property
    def marker(self) -> Path:
        return self.root / "unpickled"

    @property
    def bundle(self) -> Path:
        return self.root / "autograder.zip"

    @property
    def unix_socket(self) -> Path:  # a service's socket on the grading machine, outside the namespaces
        return Path("/run") / f"{self.token}.sock"

    @property
    def ipc_key(self) -> int:  # the SysV IPC key of the attack's segments and queues
        return int(self.token[2:9], 16)

    def bake(self, code: str) -> str:
        fake_lines, fake_json = fake_report_lines()
        values = {"TOKEN": self.token, "REPO": str(REPO), "HOME": HOME, "RESULTS": str(self.results),
                  "PORT": self.port, "MARKER": str(self.marker), "BUNDLE": str(self.bundle),
                  "SUBMISSION": str(self.submission), "FAKE_LINES": fake_lines, "FAKE_JSON": fake_json,
                  "IPC_KEY": self.ipc_key, "HOG_PROCESSES": HOG_PROCESSES, "UNIX_SOCKET": str(self.unix_socket)}
        return re.sub(r"@@([A-Z_]+)@@", lambda m: repr(values[m.group(1)]), code)


def fill_places() -> list[str]:
    import tempfile
    return list(dict.fromkeys(p for p in [tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm", HOME, str(REPO)]
                              if os.path.isdir(p)))


def processes_with(token: str) -> list[int]:
    needle, found = token.encode(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if needle in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def _libc():
    import ctypes
    import ctypes.util
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        rt = ctypes.CDLL(ctypes.util.find_library("rt") or None, use_errno=True)
    except OSError:
        rt = libc
    return libc, rt


def ipc_objects(ctx: Context) -> list[str]:
    """The SysV shared memory segments, message queues and semaphores with the attack's key."""
    found = []
    for kind in ("shm", "msg", "sem"):
        try:
            rows = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
        except OSError:
            continue
        found += [f"SysV {kind} {row.split()[1]}" for row in rows if row.split()[0] == str(ctx.ipc_key)]
    return found


def remove_ipc(ctx: Context) -> list[str]:
    """Remove the attack's IPC objects; say which POSIX message queues and keys were there."""
    import ctypes
    import platform
    libc, rt = _libc()
    for get, ctl in ((libc.shmget, libc.shmctl), (libc.msgget, libc.msgctl)):
        ident = get(ctx.ipc_key, 0, 0) if get is libc.shmget else get(ctx.ipc_key, 0)
        if ident >= 0:
            ctl(ident, 0, None)  # IPC_RMID
    found = [f"POSIX mqueue /{ctx.token}"] if rt.mq_unlink(f"/{ctx.token}".encode()) == 0 else []
    keyctl = {"x86_64": 250, "aarch64": 219}.get(platform.machine())
    libc.syscall.restype = ctypes.c_long
    try:
        uids = {int(line.split(":")[0]) for line in Path("/proc/key-users").read_text().splitlines()}
    except OSError:
        uids = set()
    for uid in sorted(uids) if keyctl else []:  # the users that hold keys: the workers' (or root, unisolated)
        keyring = libc.syscall(keyctl, 22, ctypes.c_long(uid), ctypes.c_long(-2))  # GET_PERSISTENT (others': root)
        for _ in range(16 if keyring > 0 else 0):
            key = libc.syscall(keyctl, 10, ctypes.c_long(keyring), b"user", ctx.token.encode(), ctypes.c_long(0))
            if key <= 0:
                break
            found.append(f"a key in uid {uid}'s persistent keyring")
            libc.syscall(keyctl, 21, ctypes.c_long(key))  # INVALIDATE
    return found


def watched_files() -> list[Path]:
    return sorted(p for tree in (GRADING, REPO / "ag", REPO / "tests" / "conftest.py")
                  for p in ([tree] if tree.is_file() else tree.rglob("*"))
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


def hashes() -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in watched_files()}


def clean_up(ctx: Context) -> None:
    """Undo whatever the attack could have done, whether or not the grader let it."""
    for pid in processes_with(ctx.token):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for place in fill_places() + [str(ctx.judge_cwd)]:
        try:
            for name in os.listdir(place):
                if ctx.token in name:
                    Path(place, name).unlink(missing_ok=True)
        except OSError:
            pass
    appended = re.compile(rf"\n# >>> {ctx.token}\n.*?# <<< {ctx.token}\n", re.S)
    for path in watched_files():
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError):
            continue
        if ctx.token in text:
            path.write_text(appended.sub("", text))
    remove_ipc(ctx)
    deadline = time.time() + 5
    while processes_with(ctx.token) and time.time() < deadline:
        time.sleep(0.1)


class Listener:
    """A TCP listener on 127.0.0.1 (or a Unix socket at ``path``, anyone may connect) that records
    every connection and every byte it gets."""

    def __init__(self, path: Path | None = None):
        self.path = path
        if path is None:
            self.sock = socket.socket()
            self.sock.bind(("127.0.0.1", 0))
            self.port = self.sock.getsockname()[1]
        else:
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.bind(str(path))
            os.chmod(path, 0o777)
            self.port = 0
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.connections, self.received, self.stop = 0, b"", threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.settimeout(1)
            with conn:
                try:
                    while chunk := conn.recv(65536):
                        self.received += chunk
                except OSError:
                    pass

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.sock.close()
        if self.path is not None:
            self.path.unlink(missing_ok=True)


# ---- planting the attacks ----

def after_future(source: str, code: str) -> str:
    head, marker, tail = source.partition("from __future__ import annotations\n")
    assert marker, "no `from __future__ import annotations` line"
    return head + marker + code + tail


def into_functions(source: str, number: int, code: str) -> str:
    """``code`` as the first statements of each graded function of exercise ``number``."""
    names = {name for _, name in EXERCISES[number].functions}
    lines = source.splitlines(keepends=True)
    nodes = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {n.name for n in nodes} == names, f"ex{number}: graded functions not all found"
    for node in sorted(nodes, key=lambda n: -n.body[0].lineno):
        indent = " " * node.body[0].col_offset
        at = node.body[0].lineno - 1
        lines[at:at] = [indent + line + "\n" for line in code.rstrip("\n").split("\n")]
    return "".join(lines)


def append(source: str, code: str) -> str:
    return source + "\n\n" + code


Build = Callable[[str, Context], str]


@dataclass(frozen=True)
class Attack:
    slug: str
    exercise: int
    build: Build  # (the solution's text, context) -> the hostile text
    what: str  # one line for the threat model
    check: Callable[["Run"], list[str]] | None = None  # attack-specific problems
    also: tuple[tuple[int, Build], ...] = ()  # other exercise files it changes, when it takes two
    needs_root: str = ""  # the isolation it needs, when only root can set it up
    listener: str = ""  # "tcp" or "unix": a listener the attack tries to reach
    # what the hostile file starts from: the student's stub (exercises/, so nothing in it solves
    # the exercise), or the solution for the exits (the file would pass but for the exit)
    base: str = "exercises"

    @property
    def attacked(self) -> set[int]:
        return {self.exercise} | {number for number, _ in self.also}


@dataclass
class Run:
    ctx: Context
    attack: Attack
    rc: int | None = None
    stdout: str = ""
    stderr: str = ""
    results_bytes: bytes | None = None
    results: dict | None = None
    seconds: float = 0.0
    hashes_before: dict = field(default_factory=dict)
    usage_before: dict = field(default_factory=dict)
    listener: Listener | None = None
    judge_peak: int = 0  # the highest VmHWM seen of the CLI and the judge (bytes)
    problems: list[str] = field(default_factory=list)


# ---- attack-specific checks ----

def check_hidden_not_leaked(run: Run) -> list[str]:
    outputs = {"CLI stdout": run.stdout, "CLI stderr": run.stderr,
               "results.json": (run.results_bytes or b"").decode(errors="replace")}
    for t in (run.results or {}).get("tests", []):
        outputs[f"results.json output of {t.get('name')!r}"] = "\n".join(strings_in(t))
    leaks = sorted({f"{where}: {line!r}" for where, text in outputs.items() for line in hidden_lines()
                    if line in text})
    return [f"a line of the hidden tests leaked into {leak}" for leak in leaks[:10]]


def check_files_unchanged(run: Run) -> list[str]:
    after = hashes()
    changed = sorted(p for p in set(run.hashes_before) | set(after) if run.hashes_before.get(p) != after.get(p))
    if not changed:
        return []
    return [f"{len(changed)} file(s) of tests/grading, tests/conftest.py and ag/ were created, rewritten or deleted "
            f"during grading: {', '.join(changed[:8])}{' ...' if len(changed) > 8 else ''}"]


def check_results_not_rewritten_later(run: Run) -> list[str]:
    time.sleep(4)  # the daemon strikes 2 s after results.json stops changing
    now = run.ctx.results.read_bytes() if run.ctx.results.exists() else None
    if now != run.results_bytes:
        return ["results.json was rewritten after the grader returned: "
                f"{(now or b'(deleted)')[:200].decode(errors='replace')}..."]
    return []


def check_disk_recovered(run: Run) -> list[str]:
    problems = []
    for device, (place, used) in run.usage_before.items():
        grown = shutil.disk_usage(place).used - used
        if grown > 50 << 20:
            problems.append(f"{place}'s filesystem has {grown / 2**20:.0f} MB more in use than before grading")
    return problems


def check_no_connection(run: Run) -> list[str]:
    listener = run.listener
    if listener.connections or listener.received:
        where = listener.path or f"127.0.0.1:{listener.port}"
        return [f"the listener on {where} got {listener.connections} connection(s), bytes {listener.received[:80]!r}"]
    return []


def check_output_bounded(run: Run) -> list[str]:
    problems = []
    if len(run.stdout) + len(run.stderr) > MAX_RESULTS_BYTES:
        problems.append(f"the CLI printed {len(run.stdout) + len(run.stderr):,} characters")
    return problems  # results.json's size is checked for every case


def check_no_fake_lines(run: Run) -> list[str]:
    fake_lines, _ = fake_report_lines()
    printed = {line.strip() for line in run.stdout.splitlines()}
    return [f"the CLI printed the submission's fake line {line!r}" for line in fake_lines if line.strip() in printed]


def attacked_outputs(run: Run) -> list[str]:
    return [str(t.get("output", "")) for t in (run.results or {}).get("tests", [])
            if exercise_of(t.get("name", "")) in run.attack.attacked]


def check_memory_bounded_per_worker(run: Run) -> list[str]:
    held = [int(n) for text in attacked_outputs(run) for n in re.findall(r"redteam held (\d+) GiB at once", text)]
    if held and max(held) >= HOG_PROCESSES:
        return [f"the submission held {max(held)} GiB at once in {max(held)} processes of 1 GiB, more than the "
                f"{ADDRESS_SPACE / 2**30:g} GiB one process may map: the limit is per process, so with 256 processes "
                "a worker could hold hundreds of GiB and take the machine down; bound the worker's total memory "
                "(a memory cgroup: memory.max, memory.swap.max)"]
    return []


def without_code(markdown: str) -> str:
    """Markdown with its code (fenced blocks, indented lines, inline spans) taken out."""
    text = re.sub(r"(?ms)^ {0,3}(`{3,}|~{3,}).*?^ {0,3}\1[ \t]*$", "", markdown)
    text = re.sub(r"(?m)^( {4}|\t).*$", "", text)
    return re.sub(r"(?s)(`+)(.+?)\1", "", text)


def check_no_markdown_from_the_student(run: Run) -> list[str]:
    problems = []
    for text in attacked_outputs(run):
        prose = without_code(text)
        if re.search(r"(?m)^ {0,3}#{1,6}\s+All \d+ tests passed", prose) or "![pixel](pixel.png)" in prose:
            problems.append("text from the student's code is rendered as Markdown in results.json (a heading "
                            f"saying every test passed, an image): fence it as code or escape it: {text[:300]!r}")
    return problems


def check_judge_memory(run: Run) -> list[str]:
    if run.judge_peak > JUDGE_MEMORY:
        return [f"the judge's memory peaked at {run.judge_peak / 2**20:,.0f} MiB decoding the submission's reply "
                f"(more than {JUDGE_MEMORY / 2**20:,.0f} MiB): bound what a reply may cost the judge, e.g. a small cap "
                "on the JSON header (bulk data travels as arrays)"]
    return []


def check_not_unpickled(run: Run) -> list[str]:
    if run.ctx.marker.exists():
        return ["the judge unpickled (or otherwise ran) a submission object's code: "
                f"{run.ctx.marker} exists"]
    return []


# ---- the attacks ----

ROOT_FS = "the worker's view of the filesystem (tests, ag's source and the repository hidden, root read-only)"
ROOT_PID = "a PID namespace for the worker (all its processes die with it)"
ATTACKS = [
    Attack("01-os-exit-at-import", 1, lambda s, c: after_future(s, P.OS_EXIT),
           "os._exit(0) when the file is imported: a grader that trusts the exit status passes every test",
           base="solutions"),
    Attack("02-os-exit-in-function", 6, lambda s, c: into_functions(s, 6, P.OS_EXIT),
           "os._exit(0) inside the graded functions", base="solutions"),
    Attack("03-sys-exit-at-import", 2, lambda s, c: after_future(s, P.SYS_EXIT),
           "sys.exit(0) when the file is imported", base="solutions"),
    Attack("04-sys-exit-in-function", 5, lambda s, c: into_functions(s, 5, P.SYS_EXIT),
           "sys.exit(0) inside the graded function", base="solutions"),
    Attack("04b-runner-exit-in-function", 3, lambda s, c: into_functions(s, 3, P.RUNNER_EXIT),
           "pytest.exit(returncode=0) (or KeyboardInterrupt) inside the graded function: the test "
           "runner itself ends 'successfully'", base="solutions"),
    Attack("05-call-the-library-solution", 4, lambda s, c: append(s, P.CALL_THE_LIBRARY),
           "from ag.attention import tiled_forward as _lib, then return _lib(...)"),
    Attack("06-read-the-library-source", 5, lambda s, c: append(s, c.bake(P.STEAL_THE_SOURCE)),
           "find ag's source (ag.__file__, find_spec, the distribution's files and direct_url.json, "
           "site-packages and the editable finder, the repository, /autograder, /proc/*/cwd), or its "
           "bytecode cache, or solutions/, and exec the real function", needs_root=ROOT_FS),
    Attack("07-patch-the-assertions", 3,
           lambda s, c: into_functions(after_future(s, P.PATCH_THE_ASSERTIONS), 3, P.GARBAGE_BLOCK),
           "replace numpy.testing's assert_* and np.allclose/array_equal/isclose (and pytest.approx) "
           "by ones that always pass, then return garbage"),
    Attack("08-equal-to-anything", 3,
           lambda s, c: into_functions(after_future(s, P.EQUAL_TO_ANYTHING), 3, P.RETURN_SAME),
           "return an ndarray subclass whose comparisons, isclose, isfinite, all() and == always say "
           "yes (assert_allclose passes on it)"),
    Attack("09-leak-the-hidden-tests", 3,
           lambda s, c: into_functions(append(s, c.bake(P.LEAK_THE_HIDDEN_TESTS)), 3, P.LEAK_IN_FUNCTION),
           "read tests/grading/hidden (absolute path, walking up from cwd, ag and /proc/*/cwd, the "
           "autograder bundle) and print it to stdout, stderr and into the exception message",
           check=check_hidden_not_leaked, needs_root=ROOT_FS),
    Attack("10-rewrite-tests-and-ag", 2,
           lambda s, c: into_functions(append(s, c.bake(P.TAMPER)), 2, P.TAMPER_IN_FUNCTION),
           "append to tests/grading/*.py, conftest.py (a hook that marks every test passed) and ag/*.py",
           check=check_files_unchanged, needs_root=ROOT_FS),
    Attack("11-rewrite-results-later", 1,
           lambda s, c: into_functions(append(s, c.bake(P.LATE_REWRITE)), 1, P.DAEMON_IN_FUNCTION),
           "a double-forked, setsid daemon that rewrites results.json with a perfect score 2 s after "
           "the grader returned", check=check_results_not_rewritten_later, needs_root=ROOT_PID),
    Attack("12-leave-processes", 5,
           lambda s, c: into_functions(append(s, c.bake(P.LEAVE_PROCESSES)), 5, P.SPAWN_IN_FUNCTION),
           "30 orphaned sleeps in their own sessions, holding the inherited standard streams (every case "
           "checks that nothing with its token runs on)", needs_root=ROOT_PID),
    Attack("13-infinite-loop", 4,
           lambda s, c: into_functions(after_future(s, P.IGNORE_SIGNALS), 4, P.LOOP_FOREVER),
           "an infinite loop that ignores SIGTERM/SIGINT/SIGALRM/SIGXCPU and swallows every exception"),
    Attack("14-memory-hog", 5, lambda s, c: into_functions(s, 5, P.MEMORY_HOG),
           "allocate and touch 6 GiB in 1 GiB steps"),
    Attack("14b-memory-across-processes", 1,
           lambda s, c: into_functions(append(s, c.bake(P.MEMORY_ACROSS_PROCESSES)), 1, P.HOG_ACROSS_IN_FUNCTION),
           "child processes holding 1 GiB each at once, together more than the per-process address-space "
           "limit (4 x 1 GiB against 3 GiB)",
           check=check_memory_bounded_per_worker, needs_root="a memory cgroup for the worker"),
    Attack("15-fill-the-disk", 6,
           lambda s, c: into_functions(append(s, c.bake(P.FILL_THE_DISK)), 6, P.FILL_IN_FUNCTION),
           "write until an error (at most 2 GiB each) in cwd, $TMPDIR, /tmp, /var/tmp, /dev/shm, $HOME "
           "and the repository", check=check_disk_recovered, needs_root=ROOT_FS),
    Attack("16-connect-to-localhost", 2,
           lambda s, c: into_functions(append(s, c.bake(P.CONNECT)), 2, P.CONNECT_IN_FUNCTION),
           "a TCP connection to a listener on 127.0.0.1", check=check_no_connection,
           needs_root="a network namespace for the worker", listener="tcp"),
    Attack("16b-connect-to-a-unix-socket", 6,
           lambda s, c: into_functions(append(s, c.bake(P.CONNECT_UNIX)), 6, P.CONNECT_UNIX_IN_FUNCTION),
           "connect to a Unix socket that a service on the grading machine listens on (/run/*.sock, mode 777): "
           "pathname sockets are files, reachable from any network namespace that sees them",
           check=check_no_connection, needs_root="the worker's view of /run", listener="unix"),
    Attack("17-flood-output", 4, lambda s, c: into_functions(s, 4, P.FLOOD),
           "50 MB to stdout and stderr (Python's streams and the raw fds) and a 2 MB exception message",
           check=check_output_bounded),
    Attack("18-fake-results-on-stdout", 1,
           lambda s, c: into_functions(append(s, c.bake(P.FAKE_RESULTS)), 1, P.FAKE_IN_FUNCTION),
           "print the CLI's 'passed' lines and a perfect results.json to stdout, stderr and every "
           "inherited pipe or socket", check=check_no_fake_lines),
    Attack("18b-markdown-in-results", 6,
           lambda s, c: into_functions(append(s, P.MARKDOWN_INJECTION), 6, P.MARKDOWN_IN_FUNCTION),
           "Markdown where results.json (rendered as Markdown) shows the student's doing: a returned string that "
           "closes the code span a check quotes it in, then an image; an exception whose message and source file "
           "name hold a heading 'All 62 tests passed'", check=check_no_markdown_from_the_student),
    Attack("19-pickle-payload", 6,
           lambda s, c: into_functions(append(s, c.bake(P.PICKLE_PAYLOAD)), 6, P.PAYLOAD_IN_FUNCTION),
           "return an object whose __reduce__ runs code where it is unpickled (the judge, if it unpickles)",
           check=check_not_unpickled),
    Attack("20-kill-the-judge", 2,
           lambda s, c: into_functions(append(s, c.bake(P.KILL_THE_JUDGE)), 2, P.KILL_IN_FUNCTION),
           "SIGKILL the parent and every process whose command line names the submission (the grader)",
           needs_root=ROOT_PID),
    Attack("21-ipc-leftovers", 4,
           lambda s, c: into_functions(append(s, c.bake(P.IPC_LEFTOVERS)), 4, P.IPC_IN_FUNCTION),
           "a SysV shared memory segment and message queue, a POSIX message queue and a key in the user's "
           "persistent keyring: they outlive the process and its namespaces, and could carry data to the next "
           "worker", needs_root="an IPC namespace for the worker, keyrings out of its reach"),
    Attack("22-smuggle-a-solution-between-workers", 3,
           lambda s, c: append(s, c.bake(P.SMUGGLE_STASH)),
           "ex3's file (its worker's ag holds ex4's solution) stashes tiled_forward's source in SysV shared "
           "memory and the persistent keyring; ex4's file, graded next in a fresh worker, execs it",
           also=((4, lambda s, c: append(s, c.bake(P.SMUGGLE_LOAD))),),
           needs_root="an IPC namespace for the worker, keyrings out of its reach"),
    Attack("23-amplify-in-the-judge", 6,
           lambda s, c: into_functions(append(s, P.AMPLIFY), 6, P.AMPLIFY_IN_FUNCTION),
           "return 12 million floats as a list: 60 MB on the channel, some 600 MB of Python objects in the "
           "judge that decodes it (at the channel's 256 MB cap, 4 times that)", check=check_judge_memory),
]


def build_submission(attack: Attack, ctx: Context) -> None:
    shutil.copytree(SOLUTIONS, ctx.submission, ignore=shutil.ignore_patterns("__pycache__"))
    for number, build in ((attack.exercise, attack.build), *attack.also):
        filename = EXERCISES[number].filename
        (ctx.submission / filename).write_text(build((REPO / attack.base / filename).read_text(), ctx))


# ---- the common checks ----

def check_scores(run: Run) -> list[str]:
    if run.rc != 0 or run.results is None:
        return [f"the grading did not finish: exit status {run.rc}, results.json "
                f"{'missing' if run.results_bytes is None else 'unreadable'}\n"
                f"stdout: {run.stdout[-1500:]}\nstderr: {run.stderr[-1500:]}"]
    problems = []
    if len(run.results_bytes) >= MAX_RESULTS_BYTES:
        problems.append(f"results.json is {len(run.results_bytes):,} bytes")
    try:
        import jsonschema
        jsonschema.validate(run.results, course.RESULTS_SCHEMA)
    except ImportError:
        pass
    except Exception as error:  # jsonschema.ValidationError
        problems.append(f"results.json does not validate: {str(error)[:500]}")
    tests = run.results.get("tests", [])
    names = [t.get("name", "") for t in tests]
    for function, number in graded_test_functions().items():
        if not any(name.endswith(function) or f": {function}[" in name for name in names):
            problems.append(f"ex{number}'s {function} is missing from the results")
    for t in tests:
        name, number = t.get("name", ""), exercise_of(t.get("name", ""))
        score, top, status = t.get("score"), t.get("max_score"), t.get("status")
        if number is None:
            problems.append(f"cannot tell which exercise {name!r} grades")
        elif number in run.attack.attacked:
            if score != 0 or status != "failed":
                problems.append(f"the attack scored: {name}: {status} {score}/{top}")
        elif status != "passed" or score != top:
            problems.append(f"an untouched exercise lost points: {name}: {status} {score}/{top}\n"
                            f"{str(t.get('output', ''))[-800:]}")
    if run.results.get("score") != sum(t.get("score", 0) for t in tests):
        problems.append(f"results.json's score {run.results.get('score')} is not the sum of its tests'")
    return problems


def check_leftovers(run: Run) -> list[str]:
    ctx, problems = run.ctx, []
    deadline = time.time() + 3
    while (left := processes_with(ctx.token)) and time.time() < deadline:
        time.sleep(0.1)
    if left:
        problems.append(f"{len(left)} process(es) the submission started are still running: pids {left[:10]}")
    for place in fill_places() + [str(ctx.judge_cwd)]:
        try:
            files = [name for name in os.listdir(place) if ctx.token in name]
        except OSError:
            continue
        if files:
            problems.append(f"the submission left {files} in {place}")
    written = []
    for path in watched_files():
        try:
            if ctx.token.encode() in path.read_bytes():
                written.append(str(path))
        except OSError:
            pass
    if written:
        problems.append(f"the submission wrote into {len(written)} file(s): {', '.join(written[:8])}"
                        f"{' ...' if len(written) > 8 else ''}")
    left = ipc_objects(ctx) + remove_ipc(ctx)
    if left:
        problems.append(f"IPC objects the submission made outlive it: {left}")
    return problems


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = list(Path(f"/proc/{parent}/task").glob("*"))
        except OSError:  # it exited while we looked
            continue
        for task in tasks:
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found


def watch_memory(run: Run, cli: subprocess.Popen, done: threading.Event) -> None:
    """The peak resident memory of the grader's own processes (the CLI, and the judge it starts: not
    the workers, whose memory is the submission's), sampled until ``done``."""
    while not done.wait(0.2):
        for pid in [cli.pid, *descendants(cli.pid)]:
            try:
                if pid == cli.pid or b"ag.course.judge" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    status = Path(f"/proc/{pid}/status").read_text()
                    peak = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) << 10
                    run.judge_peak = max(run.judge_peak, peak)
            except (OSError, AttributeError, ValueError):
                pass


def grade(ctx: Context, attack: Attack) -> Run:
    run = Run(ctx, attack)
    ctx.results.parent.mkdir(parents=True)
    ctx.judge_cwd.mkdir()
    run.hashes_before = hashes()
    for place in fill_places():
        run.usage_before.setdefault(os.stat(place).st_dev, (place, shutil.disk_usage(place).used))
    log_out, log_err = ctx.root / "cli.stdout", ctx.root / "cli.stderr"
    cmd = [sys.executable, "-m", "ag", "grade", str(ctx.submission), "--json", str(ctx.results),
           "--timeout", str(TIMEOUT)]
    started, done = time.perf_counter(), threading.Event()
    with open(log_out, "wb") as out, open(log_err, "wb") as err:  # files: a leftover holding a pipe cannot stall us
        cli = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=ctx.judge_cwd)
        watcher = threading.Thread(target=watch_memory, args=(run, cli, done), daemon=True)
        watcher.start()
        try:
            run.rc = cli.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            run.problems.append(f"the grading did not finish in {DEADLINE} s")
            for pid in reversed(descendants(cli.pid)):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            cli.kill()
            cli.wait()
    done.set()
    watcher.join()
    run.seconds = time.perf_counter() - started
    run.stdout = log_out.read_bytes().decode(errors="replace")
    run.stderr = log_err.read_bytes().decode(errors="replace")
    if ctx.results.exists():
        run.results_bytes = ctx.results.read_bytes()
        try:
            run.results = json.loads(run.results_bytes)
        except ValueError:
            pass
    return run


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the red team's checks read /proc (Linux)")
@pytest.mark.timeout(DEADLINE + 60)
@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.slug)
def test_a_hostile_submission_scores_zero_on_its_exercise_and_harms_nothing(attack, tmp_path):
    if attack.needs_root and not IS_ROOT:
        pytest.skip(f"needs root for {attack.needs_root}")
    ctx = Context(f"rt{secrets.token_hex(8)}", tmp_path)
    if attack.listener == "unix" and not ctx.unix_socket.parent.is_dir():
        pytest.skip(f"no {ctx.unix_socket.parent} for a service's socket")
    listener = Listener(ctx.unix_socket if attack.listener == "unix" else None) if attack.listener else None
    if listener:
        ctx.port = listener.port
    try:
        try:
            course.autograder_bundle(ctx.bundle)  # a copy of the hidden tests outside the repository
        except Exception:
            pass
        build_submission(attack, ctx)
        run = grade(ctx, attack)
        run.listener = listener
        problems = run.problems + check_scores(run)
        if attack.check:
            problems += attack.check(run)
        problems += check_leftovers(run)
    finally:
        if listener:
            listener.close()
        clean_up(ctx)
    assert not problems, (f"{attack.slug} ({attack.what}), graded in {run.seconds:.1f} s:\n- "
                          + "\n- ".join(problems))


def test_every_hostile_submission_is_python_and_changes_one_exercise_file(tmp_path):
    """Cheap: each hostile file parses, differs from the solution, and the others are untouched;
    the hidden tests have lines to look for; the test names map to their exercises."""
    assert hidden_lines(), "the hidden tests have no line of their own to look for"
    assert set(graded_test_functions().values()) == set(EXERCISES)
    for i, attack in enumerate(ATTACKS):
        ctx = Context(f"rt{secrets.token_hex(8)}", tmp_path / str(i), port=9)
        build_submission(attack, ctx)
        for e in course.EXERCISES:
            text = (ctx.submission / e.filename).read_text()
            if e.number in attack.attacked:
                ast.parse(text)
                assert text != (SOLUTIONS / e.filename).read_text(), attack.slug
                assert text != (REPO / "exercises" / e.filename).read_text(), attack.slug
                assert "@@" not in text, f"{attack.slug}: a placeholder was not filled in"
            else:
                assert text == (SOLUTIONS / e.filename).read_text(), attack.slug
    assert len({a.slug for a in ATTACKS}) == len(ATTACKS)
    assert [exercise_of(n) for n in ("ex3_online_softmax: test_x", "test_ex3_online_softmax: test_x",
                                     "test_hidden_ex3: test_x")] == [3, 3, 3]
