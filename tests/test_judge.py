"""The judge's parts: the data channel, probes cut from test files, the checks' messages."""
import importlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from ag import course
from ag.course import channel, checks, payload, sandbox
from ag.course.exercises import exercise_of

grading = importlib.import_module("ag.course.grade")  # the module: ag.course.grade is its grade()


def roundtrip(value):
    return channel.decode(channel.encode(value))


def test_plain_data_and_numeric_arrays_cross_the_channel_unchanged():
    value = {"o": np.arange(6.0).reshape(2, 3), "m": [1, 2.5, None, True, "x"], "n": {"k": np.int32(7)},
             "inf": float("inf"), "t": (1, 2)}
    got = roundtrip(value)
    np.testing.assert_array_equal(got["o"], value["o"])
    assert got["o"].dtype == np.float64 and got["o"].flags.writeable
    assert got["m"] == [1, 2.5, None, True, "x"] and got["n"] == {"k": 7} and got["inf"] == float("inf")
    assert got["t"] == [1, 2]


class EqualsAnything:
    def __eq__(self, other):
        return True


class FloatThatLies(float):
    def __eq__(self, other):
        return True


class ArrayThatLies(np.ndarray):
    def __eq__(self, other):
        return np.ones(self.shape, bool)


@pytest.mark.parametrize("hostile", [EqualsAnything(), FloatThatLies(1.0), np.zeros(3).view(ArrayThatLies),
                                     np.array([object()]), np.array(["a"]), {1: 2}, lambda: 1],
                         ids=["eq", "float-subclass", "ndarray-subclass", "object-array", "str-array",
                              "int-keys", "function"])
def test_objects_that_are_not_plain_data_are_refused_before_anything_is_sent(hostile):
    with pytest.raises(TypeError, match="cannot be sent"):
        channel.encode({"result": hostile})


@pytest.mark.parametrize("payload", [b"", b"\x00\x00\x00\x05{\"a\":", b"\x00\x00\x00\x02[]extra",
                                     b'\x00\x00\x00\x38{"__array__": 0, "dtype": "|O8", "shape": [1]}xxxxxxxx',
                                     b'\x00\x00\x00\x36{"__array__": 0, "dtype": "<f8", "shape": [99]}'])
def test_a_malformed_message_is_a_channel_error_never_an_object(payload):
    with pytest.raises(channel.ChannelError, match="malformed"):
        channel.decode(payload)


def test_a_reply_over_the_limit_is_refused_without_reading_it():
    a, b = socket.socketpair()
    with a, b:
        channel.send(a, np.zeros(1000))
        with pytest.raises(channel.ChannelError, match="at most 100 are read"):
            channel.receive(b, timeout=5, limit=100)


def test_a_silent_worker_is_a_time_out():
    a, b = socket.socketpair()
    with a, b, pytest.raises(channel.ChannelError, match="in time"):
        channel.receive(b, timeout=0.2)


def test_the_worker_gets_a_test_file_without_its_checks(tmp_path):
    source = textwrap.dedent('''
        import pytest
        from ag.course import probe

        SECRET_EXPECTED = 42

        @probe
        def run(ex, x):
            return ex.f(x)

        @pytest.mark.points(3)
        def test_f(worker):
            assert worker(run, 1) == SECRET_EXPECTED

        class TestMore:
            def test_g(self):
                assert "hidden detail"
        ''')
    path = tmp_path / "test_ex3_thing.py"
    path.write_text(source)
    cut = payload.probe_source(path)
    assert "def run(ex, x)" in cut and "SECRET_EXPECTED = 42" in cut
    assert "def test_f" not in cut and "worker(run, 1)" not in cut and "hidden detail" not in cut
    compile(cut, "probes", "exec")


def test_a_graded_file_names_its_exercise(tmp_path):
    assert exercise_of(tmp_path / "test_hidden_ex3.py").module_name == "ex3_online_softmax"
    with pytest.raises(ValueError, match="names no exercise"):
        exercise_of(tmp_path / "test_misc.py")


def test_hiding_a_folder_that_holds_python_hides_its_other_children_instead(tmp_path):
    venv = tmp_path / "course" / ".venv"
    (venv / "lib").mkdir(parents=True)
    (tmp_path / "course" / "solutions").mkdir()
    (tmp_path / "course" / "notes.txt").write_text("x")
    covered = sandbox._cover(tmp_path / "course", [venv])
    assert sorted(covered) == [str(tmp_path / "course" / "notes.txt"), str(tmp_path / "course" / "solutions")]
    assert sandbox._cover(tmp_path / "course" / "solutions", [venv]) == [str(tmp_path / "course" / "solutions")]


def test_a_check_puts_expected_beside_got():
    with pytest.raises(AssertionError) as failed:
        checks.expect_close(np.array([1.0, 2.0, 3.5]), np.array([1.0, 2.0, 3.0]), what="O")
    message = str(failed.value)
    assert "**O**" in message and "` (2,) `" in message and "` 3 `" in message and "` 3.5 `" in message
    with pytest.raises(AssertionError, match="expected an array of numbers of shape"):
        checks.expect_close([1.0, 2.0], np.array([1.0, 2.0]), what="O")
    with pytest.raises(AssertionError, match="expected shape"):
        checks.expect_close(np.zeros(3), np.zeros(2), what="O")
    with pytest.raises(AssertionError):
        checks.expect_close(np.array([np.nan]), np.array([1.0]), what="O")


def test_equality_checks_compare_types_too():
    checks.expect_equal([1, 2], [1, 2], what="plan")
    with pytest.raises(AssertionError):
        checks.expect_equal(1.0, 1, what="count")
    with pytest.raises(AssertionError):
        checks.expect_equal(np.zeros(2), None, what="grad")


@pytest.mark.parametrize("hostile", ["a ` b", "``x``", "x`\n\n# All 62 tests passed\n![](http://x/y.png)",
                                     "```\n# heading\n```"])
def test_student_text_stays_code_whatever_it_holds(hostile):
    inline = checks.code(hostile)
    fence = inline.split(" ")[0]
    assert set(fence) == {"`"} and inline.endswith(" " + fence) and "\n" not in inline
    assert fence not in inline[len(fence):-len(fence)]  # nothing inside closes the span
    block = checks.fenced(hostile)
    opening, *body, closing = block.split("\n")
    assert opening == closing + "text" and all(not line.startswith(closing) for line in body)


def test_a_reply_whose_plain_data_would_blow_up_the_judge_is_refused_before_parsing():
    payload = channel.encode(list(range(300_000)))
    with pytest.raises(channel.ChannelError, match="plain data is .* at most"):
        channel.decode(payload)
    assert channel.decode(channel.encode(np.arange(300_000))).shape == (300_000,)  # arrays go through


REPO = Path(__file__).resolve().parent.parent
EX3 = next(e for e in course.EXERCISES if e.number == 3)


@pytest.fixture
def reduced(monkeypatch):
    """The worker as a student's own `ag grade` runs it without root: no namespaces, no user switch."""
    monkeypatch.setattr(sandbox, "isolating", lambda: False)


def reduced_worker(submission, timeout=20):
    files = payload.worker_files(EX3, submission, REPO / "tests" / "grading")
    worker = sandbox.Worker(files, {"exercise": 3}, label=f"your {EX3.filename}", timeout=timeout,
                            trees=payload.worker_trees(EX3))
    worker.start()
    return worker


def test_without_root_the_worker_still_runs_apart_and_returns_only_data(reduced, tmp_path):
    shutil.copy(REPO / "solutions" / EX3.filename, tmp_path)
    block = (np.ones((2, 1)), np.zeros((2, 1)), np.ones((2, 1)))
    worker = reduced_worker(tmp_path)
    try:
        got = worker.call("test_ex3_online_softmax:merge", [block, block], {})
        assert worker.proc.pid != os.getpid()
    finally:
        worker.close()
    np.testing.assert_array_equal(got["o"], np.ones((2, 1)))
    assert worker.proc is None and worker.scratch is None  # reaped, and its scratch folder is gone


def test_without_root_an_exit_at_import_is_the_students_failure_not_a_pass(reduced, tmp_path):
    source = (REPO / "solutions" / EX3.filename).read_text()
    (tmp_path / EX3.filename).write_text(source.replace("from __future__ import annotations\n",
                                                        "from __future__ import annotations\nimport os\nos._exit(0)\n"))
    with pytest.raises(sandbox.StudentError, match="could not be loaded"):
        reduced_worker(tmp_path)


def test_without_root_processes_left_in_the_workers_group_are_killed(reduced, tmp_path):
    token = f"ag-reduced-{os.getpid()}"
    source = (REPO / "solutions" / EX3.filename).read_text()
    spawn = (f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', "
             f"'{token}'])\n")
    (tmp_path / EX3.filename).write_text(source + "\n" + spawn)
    reduced_worker(tmp_path).close()
    time.sleep(0.2)
    alive = [p for p in Path("/proc").iterdir() if p.name.isdigit() and token in _cmdline(p)]
    assert alive == []


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def test_the_judge_loads_no_installed_pytest_plugin_but_its_own(tmp_path):
    """Installed plugins (pytest-timeout, hypothesis, xdist, nbmake: this suite's own) stay out of a
    grading session: they cost seconds of imports per submission and could change how checks run."""
    tests = tmp_path / "graded"
    tests.mkdir()
    (tests / "test_ex1_plugins.py").write_text(textwrap.dedent("""\
        import pytest

        @pytest.mark.points(1)
        def test_only_ag_is_plugged_in(request):
            manager = request.config.pluginmanager
            assert manager.list_plugin_distinfo() == [], [d.project_name for _, d in manager.list_plugin_distinfo()]
            assert manager.has_plugin("ag.course.judge")
        """))
    submission = tmp_path / "submission"
    submission.mkdir()
    report = course.grade(submission, tests)
    assert [(t.status, t.output) for t in report.tests] == [("passed", "")]


def one_graded_test(folder: Path, body: str) -> Path:
    folder.mkdir()
    (folder / "test_ex1_judge.py").write_text(f"import pytest\n\n\n@pytest.mark.points(1)\ndef test_it():\n{body}")
    return folder


def settled(proc_file: Path, seconds: float = 10.0) -> str:
    """``proc_file`` once the kernel has filled it in: Popen returns when exec closes its pipe, a moment
    before the new process's arguments and environment are set up (read then, both are empty)."""
    deadline = time.monotonic() + seconds
    while not (text := proc_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return text


def test_the_judge_runs_isolated_in_its_own_folder_with_only_the_allowlisted_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TA_API_TOKEN", "ta-secret")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.chdir(tmp_path)
    judge = grading.Judge(one_graded_test(tmp_path / "graded", "    pass\n"))
    try:
        environ = dict(v.split("=", 1) for v in settled(Path(f"/proc/{judge.process.pid}/environ")).split("\0") if v)
        cwd = os.readlink(f"/proc/{judge.process.pid}/cwd")
        argv = settled(Path(f"/proc/{judge.process.pid}/cmdline")).split("\0")
    finally:
        judge.close()
    assert "TA_API_TOKEN" not in environ and "PYTHONPATH" not in environ
    assert environ["LC_ALL"] == "C.UTF-8" and environ["PATH"] == os.environ["PATH"]
    assert cwd == judge.scratch.name and "-I" in argv


def test_the_judge_imports_the_ag_that_launched_it_even_where_isolation_alone_would_not_find_it(tmp_path):
    fake = tmp_path / "elsewhere"
    (fake / "ag" / "course").mkdir(parents=True)
    (fake / "ag" / "__init__.py").write_text("")
    (fake / "ag" / "course" / "__init__.py").write_text("")
    (fake / "ag" / "course" / "judge.py").write_text("def main(argv):\n    print('this ag', argv)\n    return 0\n")
    boot = [sys.executable, "-I", "-c", grading.BOOT]
    other = subprocess.run([*boot, str(fake), str(fake / "ag" / "__init__.py"), "x"], capture_output=True, text=True)
    assert other.stdout == "this ag ['x']\n", other.stderr
    same = subprocess.run([*boot, str(fake), os.path.realpath(course.PACKAGE / "__init__.py"), "--help"],
                          capture_output=True, text=True)
    assert same.returncode == 0 and "python -m ag.course.judge" in same.stdout


def test_a_judge_silent_past_the_student_limit_is_stopped_and_the_student_not_graded(tmp_path, monkeypatch):
    monkeypatch.setattr(grading, "JUDGE_GRACE", 1.0)
    temp = tmp_path / "tmp"  # the judge's and its caller's temporary folders go here
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    tests = one_graded_test(tmp_path / "graded", "    import time\n    time.sleep(120)\n")
    submission = tmp_path / "submission"
    submission.mkdir()
    judge = grading.Judge(tests, student_timeout=2)
    started = time.perf_counter()
    try:
        with pytest.raises(RuntimeError, match=r"did not answer within 3 s .*it was stopped"):
            judge.grade(submission)
        assert time.perf_counter() - started < 30 and judge.process.poll() is not None
    finally:
        judge.close()
    assert list(temp.iterdir()) == []  # a judge stopped mid-grade leaves no folder behind


BOUNDED = '''\
import numpy as np
import pytest

from ag.course import probe

WORKER_HEADROOM = 1 << 29
CALLS = []


@probe
def limit_and_calls(ex):
    import resource
    from ag.course.worker import mapped_bytes
    CALLS.append(1)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    return [soft == hard == ex.LIMIT_AT_IMPORT, 0 < soft - (1 << 29) <= mapped_bytes(), len(CALLS)]


@probe
def allocates(ex, mib):
    try:
        return int(np.ones(mib << 17).sum()) == mib << 17
    except MemoryError:
        return "MemoryError"


@pytest.mark.points(1)
def test_first(worker):
    assert worker.once(limit_and_calls) == [True, True, 1]


@pytest.mark.points(1)
def test_second(worker):
    assert worker.once(limit_and_calls) == [True, True, 1]
    assert worker(limit_and_calls) == [True, True, 2]


@pytest.mark.points(1)
def test_the_headroom_holds_half_of_it_and_not_an_eighth_more(worker):
    assert worker(allocates, 256) is True
    assert worker(allocates, 576) == "MemoryError"  # exactly 512 may fit: the worker's own mappings shrink
'''

LIMIT_AT_IMPORT = "\nimport resource\nLIMIT_AT_IMPORT = resource.getrlimit(resource.RLIMIT_AS)[0]\n"


def test_a_test_file_bounds_its_worker_past_its_start_before_student_code_and_a_shared_probe_runs_once(tmp_path):
    tests = tmp_path / "graded"
    tests.mkdir()
    (tests / "test_ex3_bounded.py").write_text(BOUNDED)
    submission = tmp_path / "submission"
    submission.mkdir()
    (submission / EX3.filename).write_text((REPO / "solutions" / EX3.filename).read_text() + LIMIT_AT_IMPORT)
    report = course.grade(submission, tests)
    assert [(t.status, t.output) for t in report.tests] == [("passed", "")] * 3


def test_the_workers_ag_comes_with_bytecode_that_python_reads_only_while_its_source_is_unchanged(tmp_path):
    files = payload.with_bytecode({"pkg/__init__.py": b"X = 1\n"})
    cached = importlib.util.cache_from_source("pkg/__init__.py", optimization="")
    assert set(files) == {"pkg/__init__.py", cached}
    for path, data in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(data)
    load = [sys.executable, "-I", "-B", "-v", "-c", "import sys; sys.path.insert(0, sys.argv[1]); import pkg; "
            "print(pkg.X)", str(tmp_path)]
    first = subprocess.run(load, capture_output=True, text=True)
    assert first.stdout == "1\n" and f"{tmp_path / cached} matches {tmp_path / 'pkg' / '__init__.py'}" in first.stderr
    (tmp_path / "pkg" / "__init__.py").write_bytes(b"X = 2\n")
    assert subprocess.run(load, capture_output=True, text=True).stdout == "2\n"
