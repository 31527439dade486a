"""The red team against the worker's /dev and its mounts (issue 48, hole 2).

A worker's ag holds the solutions of every exercise but its own. If anything a worker can write
outlives it (a POSIX message queue in the host's /dev/mqueue, a file in a writable submount of a
read-only bind), a worker for one exercise can leave a solution there for a later worker to exec.
Each case here grades for real, as root, through the CLI (test_redteam.py's harness): 0 on the
attacked exercises, full marks elsewhere, nothing left behind.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from test_redteam import (DEADLINE, IS_ROOT, REPO, TIMEOUT, Attack, Context, Run, append, build_submission,
                          check_leftovers, check_scores, clean_up)

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux's"),
              pytest.mark.skipif(not IS_ROOT, reason="the worker's /dev and mounts are set up as root only")]

DEV_HELPERS = r'''
def _rt_mq():
    import ctypes, ctypes.util
    rt = ctypes.CDLL(ctypes.util.find_library("rt") or None, use_errno=True)
    rt.mq_open.restype = ctypes.c_int
    rt.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    rt.mq_send.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint]
    rt.mq_receive.restype = ctypes.c_ssize_t
    rt.mq_receive.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p]
    return ctypes, rt


def _rt_places():
    """Every folder under /dev (and the submount the test made) where a file might outlive the worker."""
    import os
    places = [@@SUBMOUNT@@]
    for top, folders, _ in os.walk("/dev"):
        places.append(top)
    return places
'''

STASH = DEV_HELPERS + r'''

def _rt_stash():
    """In exercise 3's worker, whose ag has exercise 4's solution: leave its source everywhere."""
    import inspect, os
    import ag.attention
    source = inspect.getsource(ag.attention.tiled_forward).encode()
    left = []
    ctypes, rt = _rt_mq()
    queue = rt.mq_open(("/" + @@TOKEN@@).encode(), os.O_CREAT | os.O_WRONLY, 0o666, None)
    for start in range(0, len(source), 4096) if queue >= 0 else ():
        if rt.mq_send(queue, source[start:start + 4096], len(source[start:start + 4096]), 0) == 0:
            left.append("mqueue")
    for place in _rt_places():
        try:
            with open(os.path.join(place, @@TOKEN@@), "wb") as out:
                out.write(source)
            left.append(place)
        except OSError:
            pass
    return left


_rt_stash()
'''

LOAD = DEV_HELPERS + r'''

def _rt_smuggled():
    """In exercise 4's worker, whose tiled_forward is a stub: what exercise 3's worker left."""
    import os
    import ag.attention.forward
    ctypes, rt = _rt_mq()
    found = []
    queue = rt.mq_open(("/" + @@TOKEN@@).encode(), os.O_RDONLY | os.O_NONBLOCK, 0, None)
    buffer = ctypes.create_string_buffer(1 << 16)
    while queue >= 0 and (size := rt.mq_receive(queue, buffer, len(buffer), None)) > 0:
        found.append(buffer.raw[:size])
    sources = [b"".join(found)] if found else []
    for place in _rt_places():
        try:
            sources.append(open(os.path.join(place, @@TOKEN@@), "rb").read())
        except OSError:
            pass
    for source in sources:
        try:
            namespace = dict(vars(ag.attention.forward))
            exec(source.decode(), namespace)
            return namespace["tiled_forward"]
        except Exception:
            continue
    return None


_rt_solution = _rt_smuggled()
if _rt_solution is not None:
    tiled_forward = _rt_solution
'''


def smuggling(submount: str) -> Attack:
    def bake(code: str, ctx: Context) -> str:
        return ctx.bake(code.replace("@@SUBMOUNT@@", repr(submount)))
    return Attack("dev-mqueue-smuggling", 3, lambda s, c: append(s, bake(STASH, c)),
                  "ex3's worker (its ag holds ex4's solution) leaves tiled_forward's source in a POSIX queue "
                  "(/dev/mqueue as the host mounts it), in every folder under /dev and in a submount of a "
                  "read-only bind; ex4's worker, started next, execs what it finds",
                  also=((4, lambda s, c: append(s, bake(LOAD, c))),))


GRADE_IN_A_MACHINE_LIKE_MOST = r'''
set -e
mountpoint -q /dev/mqueue || mount -t mqueue mqueue /dev/mqueue
mount -t tmpfs -o mode=1777 tmpfs "$1"
shift
exec "$@"
'''


@contextlib.contextmanager
def dev_mqueue():
    """/dev/mqueue as most machines have it (this one may have no folder there)."""
    made = not os.path.isdir("/dev/mqueue")
    if made:
        os.mkdir("/dev/mqueue")
    try:
        yield
    finally:
        if made:
            with contextlib.suppress(OSError):
                os.rmdir("/dev/mqueue")


def grade_with_mounts(ctx: Context, attack: Attack, submount: Path) -> Run:
    """Grade through the CLI in a mount namespace of its own in which the host's mqueue is at
    /dev/mqueue and a writable tmpfs is mounted inside Python's prefix (an allowed folder)."""
    run = Run(ctx, attack)
    ctx.results.parent.mkdir(parents=True)
    ctx.judge_cwd.mkdir()
    command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", GRADE_IN_A_MACHINE_LIKE_MOST, "sh",
               str(submount), sys.executable, "-m", "ag", "grade", str(ctx.submission), "--json", str(ctx.results),
               "--timeout", str(TIMEOUT)]
    done = subprocess.run(command, cwd=ctx.judge_cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=DEADLINE)
    run.rc, run.stdout, run.stderr = done.returncode, done.stdout, done.stderr
    if ctx.results.exists():
        run.results_bytes = ctx.results.read_bytes()
        run.results = json.loads(run.results_bytes)
    return run


@pytest.mark.slow
@pytest.mark.timeout(DEADLINE + 60)
def test_a_solution_left_under_dev_or_in_a_submount_does_not_reach_the_next_worker(tmp_path):
    ctx = Context(f"rt{secrets.token_hex(8)}", tmp_path)
    with tempfile.TemporaryDirectory(dir=sys.prefix, prefix="ag-submount-") as submount, dev_mqueue():
        attack = smuggling(submount)
        build_submission(attack, ctx)
        try:
            run = grade_with_mounts(ctx, attack, Path(submount))
            problems = check_scores(run) + check_leftovers(run)
            left = [p for p in ("/dev/mqueue", "/dev/shm", submount) if (Path(p) / ctx.token).exists()]
        finally:
            clean_up(ctx)
    assert not problems and not left, f"{attack.what}:\n- " + "\n- ".join(problems + [f"left in {p}" for p in left])


SUBMOUNT_WRITE = '''
import json, sys
from pathlib import Path
from ag import course
from ag.course import payload, sandbox
submount, repo = sys.argv[1], Path(sys.argv[2])
ex3 = next(e for e in course.EXERCISES if e.number == 3)
files = payload.worker_files(ex3, repo / "solutions", repo / "tests" / "grading")
files["lib/sandbox_probes.py"] = b"""
def write(ex, path):
    try:
        open(path, "w").close()
    except OSError as error:
        return error.errno
    return 0
"""
worker = sandbox.Worker(files, {"exercise": 3}, label="ex3", timeout=60, trees=payload.worker_trees(ex3))
worker.start()
try:
    print(json.dumps([worker.call("sandbox_probes:write", [f"{submount}/x"], {}),
                      worker.call("sandbox_probes:write", ["/dev/shm/x"], {})]))
finally:
    worker.close()
'''


def test_writes_to_a_submount_of_an_allowed_folder_fail_in_the_worker():
    """A writable tmpfs mounted inside Python's prefix (read-only in the worker, as a bind) stays read-only there."""
    with tempfile.TemporaryDirectory(dir=sys.prefix, prefix="ag-submount-") as submount:
        command = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                   'mount -t tmpfs -o mode=1777 tmpfs "$1" && shift && exec "$@"', "sh", submount,
                   sys.executable, "-c", SUBMOUNT_WRITE, submount, str(REPO)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        assert os.listdir(submount) == []
    assert json.loads(done.stdout.splitlines()[-1]) == [30, 0]  # EROFS in the submount; the scratch /dev/shm works
