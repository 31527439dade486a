"""The sandbox as root: a Python anywhere builds a worker, whose root is read-only all the way down
but for its scratch mounts, whose /dev is its own, whose memory its cgroup measures; and a judge
that dies or is stopped mid-grade leaves no cgroup and no worker behind.

These tests need root (namespaces, mounts, cgroups); CI runs as root, so there they run.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ag import course
from ag.course import cgroups, launcher, payload, sandbox

REPO = Path(__file__).resolve().parents[1]
GRADING = REPO / "tests" / "grading"
SOLUTIONS = REPO / "solutions"
EX1, EX3 = (next(e for e in course.EXERCISES if e.number == n) for n in (1, 3))
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
SCRATCH = {path for path, _ in sandbox.SCRATCH_MOUNTS}
DEVICES = {f"/dev/{name}" for name in launcher.DEVICES}

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux's"),
              pytest.mark.skipif(not IS_ROOT, reason="the sandbox's isolation needs root (CI runs as root)")]

PROBES = '''
import os


def mounts(ex):
    """(mount point, per-mount options) of every mount the worker sees."""
    found = []
    for line in open("/proc/self/mountinfo"):
        fields = line.split()
        found.append([fields[4], fields[5].split(",")])
    return found


def write(ex, path):
    try:
        with open(path, "w") as out:
            out.write("x")
    except OSError as error:
        return error.errno
    return 0


def listing(ex, path):
    return sorted(os.listdir(path)) if os.path.isdir(path) else None


def read(ex, path, size):
    with open(path, "rb") as source:
        return len(source.read(size))


def hold(ex, megabytes):
    import numpy as np
    block = np.ones(megabytes << 17)  # 8 bytes each, touched
    return float(block.sum())
'''


@contextlib.contextmanager
def worker_with_probes():
    """A worker for exercise 3 of the solutions, with the probes above beside the graded ones."""
    files = payload.worker_files(EX3, SOLUTIONS, GRADING)
    files["lib/sandbox_probes.py"] = PROBES.encode()
    worker = sandbox.Worker(files, {"exercise": 3}, label=f"your {EX3.filename}", timeout=60,
                            hide=payload.secrets(GRADING, SOLUTIONS), trees=payload.worker_trees(EX3))
    worker.start()
    try:
        yield lambda name, *args: worker.call(f"sandbox_probes:{name}", args, {})
    finally:
        worker.close()


def grade(python: str, submission: Path, out: Path, cwd: Path, timeout: float = 20) -> subprocess.Popen:
    command = [python, "-m", "ag", "grade", str(submission), "--json", str(out), "--timeout", str(timeout)]
    return subprocess.Popen(command, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def assert_full_marks(cli: subprocess.Popen, out: Path) -> None:
    printed, _ = cli.communicate(timeout=600)
    assert cli.returncode == 0 and out.exists(), printed[-3000:]
    results = json.loads(out.read_text())
    failed = [t["name"] for t in results["tests"] if t["status"] != "passed"]
    assert failed == [] and results["score"] == results["max_score"] > 0, printed[-3000:]


def make_venv(where: Path, *, copies: bool) -> Path:
    """A venv with the system's packages (NumPy...), and this checkout's ag on its path."""
    command = [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(where)]
    subprocess.run(command + (["--copies"] if copies else []), check=True)
    python = where / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "ag-checkout.pth").write_text(str(REPO) + "\n")
    return python


@pytest.mark.parametrize("copies", [False, True], ids=["symlinks", "copies"])
def test_a_python_in_a_venv_under_tmp_grades_the_solutions_to_full_marks(tmp_path, copies):
    python = make_venv(tmp_path / "venv", copies=copies)
    assert str(python).startswith(tempfile.gettempdir())
    assert_full_marks(grade(str(python), SOLUTIONS, tmp_path / "results.json", tmp_path), tmp_path / "results.json")


def test_a_python_in_a_venv_under_var_tmp_grades_the_solutions_to_full_marks(tmp_path):
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="ag-test-venv-") as where:
        python = make_venv(Path(where) / "venv", copies=False)
        assert_full_marks(grade(str(python), SOLUTIONS, tmp_path / "results.json", tmp_path),
                          tmp_path / "results.json")


def test_in_the_worker_every_mount_is_read_only_but_the_scratch_ones():
    with worker_with_probes() as probe:
        seen = probe("mounts")
        written = {point: probe("write", f"{point.rstrip('/')}/ag-sandbox-test") for point, _ in seen
                   if point != "/proc" and point not in DEVICES}
    writable = sorted(point for point, options in seen if "rw" in options)
    assert writable == sorted(SCRATCH), seen
    # /run is a fresh tmpfs too, but root's (mode 755): the worker writes in the other three
    assert {point for point, errno in written.items() if errno == 0} == SCRATCH - {"/run"}, written
    assert all(errno in (13, 30) for point, errno in written.items() if point not in SCRATCH), written  # EACCES, EROFS


def test_the_workers_dev_holds_the_harmless_devices_and_no_mqueue():
    with worker_with_probes() as probe:
        dev = probe("listing", "/dev")
        assert probe("write", "/dev/null") == 0 and probe("write", "/dev/full") == 28  # ENOSPC, as it should
        assert probe("read", "/dev/urandom", 16) == 16 and probe("read", "/dev/zero", 16) == 16
        assert probe("listing", "/dev/shm") == [] and probe("listing", "/dev/mqueue") is None
        assert probe("write", "/dev/ag-sandbox-test") in (13, 30)
    assert dev == sorted(["fd", "full", "null", "random", "shm", "stderr", "stdin", "stdout", "urandom", "zero"])


def test_the_workers_memory_peak_is_measured_by_its_cgroup_from_outside():
    files = payload.worker_files(EX3, SOLUTIONS, GRADING)
    files["lib/sandbox_probes.py"] = PROBES.encode()
    worker = sandbox.Worker(files, {"exercise": 3}, label=f"your {EX3.filename}", timeout=60,
                            trees=payload.worker_trees(EX3))
    worker.start()
    try:
        assert worker.memory_peak(reset=True) is None
        worker.call("sandbox_probes:hold", [256], {})
        big = worker.memory_peak()
        worker.memory_peak(reset=True)
        worker.call("sandbox_probes:hold", [8], {})
        small = worker.memory_peak()
    finally:
        worker.close()
    assert big is not None and big >= 256 << 20, big
    assert small is not None and small < big - (128 << 20), (small, big)


SUBMOUNT_SCRIPT = '''
import json, os, subprocess, sys
from ag.course import launcher
base, how = sys.argv[1], sys.argv[2]
source, target = os.path.join(base, "source dir"), os.path.join(base, "target")
os.makedirs(os.path.join(source, "sub"))
os.makedirs(target)
subprocess.run(["mount", "-t", "tmpfs", "tmpfs", os.path.join(source, "sub")], check=True)
launcher._mount(source, target, None, launcher.MS_BIND | launcher.MS_REC)
getattr(launcher, how)(target)
errors = {}
for path in (os.path.join(target, "x"), os.path.join(target, "sub", "x")):
    try:
        open(path, "w").close()
        errors[path] = 0
    except OSError as error:
        errors[path] = error.errno
print(json.dumps(errors))
'''


@pytest.mark.parametrize("how", ["_read_only", "_read_only_one_by_one"])
def test_the_launcher_makes_a_bind_read_only_all_the_way_down(tmp_path, how):
    """mount_setattr(2) with AT_RECURSIVE, and the fallback for kernels without it (each submount remounted)."""
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c", SUBMOUNT_SCRIPT,
                           str(tmp_path), how], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    errors = json.loads(done.stdout)
    assert len(errors) == 2 and set(errors.values()) == {30}, errors  # EROFS, the submount too


def slow_submission(where: Path) -> Path:
    """The solutions, but exercise 1's file sleeps at import: its judge is mid-grade for a minute."""
    submission = where / "slow"
    submission.mkdir()
    for exercise in course.EXERCISES:
        (submission / exercise.filename).write_text((SOLUTIONS / exercise.filename).read_text())
    with open(submission / EX1.filename, "a") as source:
        source.write("\nimport time\ntime.sleep(120)\n")
    return submission


def judge_of(cli: subprocess.Popen) -> int:
    for entry in Path("/proc").iterdir():
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == cli.pid and b"ag.course.judge" in (entry / "cmdline").read_bytes():
                return int(entry.name)
        except (OSError, ValueError, IndexError):
            continue
    return 0


def groups_of(judge: int) -> list[Path]:
    return [g for parent in cgroups.parents() if parent.is_dir() for g in parent.glob(f"{judge}-*")]


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@contextlib.contextmanager
def judge_mid_grade(tmp_path: Path):
    """A grading whose judge has started a worker that is still loading: (the CLI, the judge's
    pid, the worker's processes); whatever the test leaves of them is killed afterwards."""
    cli = grade(sys.executable, slow_submission(tmp_path), tmp_path / "slow.json", tmp_path, timeout=60)
    judge, procs, deadline = 0, [], time.time() + 120
    while not procs and time.time() < deadline:
        time.sleep(0.2)
        judge = judge_of(cli)
        procs = [int(p) for g in groups_of(judge) if judge for p in (g / "cgroup.procs").read_text().split()]
    try:
        if not procs:
            cli.kill()
            pytest.fail(f"no worker of the judge appeared in a cgroup: {cli.communicate()[0][-2000:]}")
        yield cli, judge, procs
    finally:
        for pid in procs:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        cgroups.remove(groups_of(judge))
        cli.kill()


def test_a_judge_killed_mid_grade_leaves_no_cgroup_once_the_next_judge_starts(tmp_path):
    with judge_mid_grade(tmp_path) as (cli, judge, procs):
        os.kill(judge, signal.SIGKILL)
        # at once: any judge that starts meanwhile (a parallel test's) removes it, as the next one must
        assert groups_of(judge), "the killed judge's worker group should be left for the next judge to remove"
        cli.communicate(timeout=120)
        assert_full_marks(grade(sys.executable, SOLUTIONS, tmp_path / "again.json", tmp_path),
                          tmp_path / "again.json")
        assert groups_of(judge) == []
        assert [pid for pid in procs if running(pid)] == []


def test_a_judge_told_to_stop_mid_grade_kills_its_worker_and_removes_its_cgroup(tmp_path):
    with judge_mid_grade(tmp_path) as (cli, judge, procs):
        os.kill(judge, signal.SIGTERM)
        cli.communicate(timeout=120)
        deadline = time.time() + 10
        while (groups_of(judge) or any(map(running, procs))) and time.time() < deadline:
            time.sleep(0.1)
        assert groups_of(judge) == [] and [pid for pid in procs if running(pid)] == []


def test_a_python_under_the_stage_is_reached_through_the_handle_taken_before_it_is_covered():
    assert launcher._reachable("/tmp/venv/bin", 7) == "/proc/self/fd/7/venv/bin"
    assert launcher._reachable("/tmpfoo", 7) == "/tmpfoo" and launcher._reachable("/usr", 7) == "/usr"


def test_a_secret_is_covered_where_the_workers_root_holds_it_and_only_there(tmp_path):
    outside = tmp_path / "course" / "solutions"
    outside.mkdir(parents=True)
    assert sandbox.covered([outside]) == []
    with tempfile.TemporaryDirectory(dir=sys.prefix, prefix="ag-test-secret-") as inside:
        assert sandbox.covered([Path(inside), outside]) == [str(Path(inside).resolve())]
