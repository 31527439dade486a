"""The worker's launcher: builds the sandbox, then becomes the worker.

The judge starts it as ``python -I -S launcher.py FD`` (standard library only: nothing of ag
is imported here, so no solution is in this process's memory), under
``unshare --mount --net --ipc --pid --fork --mount-proc`` when the judge is root. It reads one
message from the channel FD, plain JSON (the sandbox's files, limits and paths, as the judge
chose them), and then, when isolating:

1. builds a new root in its private mount namespace from an allowlist: the system folders and
   Python's (wherever it lives, /tmp included), read-only at their own paths down to every
   submount, with ag's own install covered; a read-only /proc; a /dev of its own (null, zero,
   full, random, urandom); small fresh tmpfs on /tmp, /var/tmp, /dev/shm and /run: the worker
   can write nowhere else, and nothing else on the machine (the graded tests, ag's source, any
   other checkout, other students, the results, the host's /dev/mqueue) exists for it;
2. writes the sandbox (the probes, the submission) under /tmp/sandbox, owned by root, binds
   there read-only the folders the judge names (the ag tree with the graded exercise stubbed,
   written once by the judge), and chroots into the new root;
3. makes a scratch folder owned by the worker;
4. sets the rlimits, drops to the unprivileged worker user, forbids new privileges and the
   kernel keyring calls (seccomp); it joined the worker's cgroup (memory and processes for all
   its processes together) first of all;
5. execs Python running ``ag.course.worker.main`` in the scratch folder, on the same channel.

It is PID 1 of its PID namespace from then on: when it exits or is killed, the kernel kills
every process left in the namespace, however it was forked.
"""
import base64
import ctypes
import json
import os
import re
import resource
import shutil
import struct
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
KEPT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
              "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}
SANDBOX = "/tmp/sandbox"
STAGE = "/tmp"  # where the new root is built, on a tmpfs of its own
DEVICES = ("null", "zero", "full", "random", "urandom")
DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
             "stderr": "/proc/self/fd/2"}
MOUNT_SETATTR = 442  # the same number on x86_64 and aarch64
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY = 1  # and MOUNT_ATTR_NOSUID, _NODEV, _NOEXEC are 2, 4, 8, as MS_NOSUID, MS_NODEV, MS_NOEXEC
PR_SET_NO_NEW_PRIVS = 38
LIMITS = {"cpu": resource.RLIMIT_CPU, "address_space": resource.RLIMIT_AS, "processes": resource.RLIMIT_NPROC,
          "file_size": resource.RLIMIT_FSIZE, "open_files": resource.RLIMIT_NOFILE, "core": resource.RLIMIT_CORE}

_libc = ctypes.CDLL(None, use_errno=True)


def main(fd: int) -> None:
    config = _read_config(fd)
    root = SANDBOX if config["isolate"] else config["root"]
    for procs in config["cgroups"]:  # before the remount below makes the cgroup file system read-only
        with open(procs, "w") as joining:
            joining.write("0")  # this process, and so everything it starts
    if config["isolate"]:
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        new_root = _build_root(config)
        _write_files(new_root + root, config["files"])
        _mount(None, new_root, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)  # this mount only
        os.chroot(new_root)
    else:
        _write_files(root, config["files"])
        for relative, source in config["trees"].items():
            shutil.copytree(source, _inside(root, relative))
    work = os.path.join(root, "work")
    os.makedirs(work, mode=0o700, exist_ok=True)
    if config["isolate"]:
        os.chown(work, config["uid"], config["gid"])
    for name, value in config["limits"].items():
        resource.setrlimit(LIMITS[name], (value, value))
    if config["isolate"]:
        os.setgroups([])
        os.setgid(config["gid"])
        os.setuid(config["uid"])
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    _forbid_keyrings()
    os.chdir(work)
    devnull = os.open(os.devnull, os.O_RDWR)
    for stream in (0, 1, 2):  # the worker's output goes nowhere: nothing it prints is read
        os.dup2(devnull, stream)
    env = dict(config["env"], HOME=work, PYTHONPATH=os.path.join(root, "lib"), AG_SANDBOX=root)
    start = "import json, sys; from ag.course.worker import main; main(int(sys.argv[1]), json.loads(sys.argv[2]))"
    worker = dict(config["worker"], submission=os.path.join(root, "submission"))
    argv = [config["python"], "-s", "-B", "-c", start, str(fd), json.dumps(worker)]
    os.execve(config["python"], argv, env)


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


# (audit architecture, the syscall numbers of add_key, request_key and keyctl)
KEYRING_SYSCALLS = {"x86_64": (0xC000003E, (248, 249, 250)), "aarch64": (0xC00000B7, (217, 218, 219))}
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
BPF_LD_ABS_W, BPF_JEQ, BPF_JGE, BPF_RET = 0x20, 0x15, 0x35, 0x06
SECCOMP_ALLOW, SECCOMP_EPERM = 0x7FFF0000, 0x00050000 | 1
X32_BIT = 0x40000000


def _forbid_keyrings() -> None:
    """A seccomp filter that refuses the kernel keyring calls: a user's keyrings outlive every
    namespace, so a worker could leave a solution in one for the next worker to read."""
    arch = os.uname().machine
    if arch not in KEYRING_SYSCALLS:
        return
    audit, numbers = KEYRING_SYSCALLS[arch]
    program = [(BPF_LD_ABS_W, 0, 0, 4), (BPF_JEQ, 1, 0, audit), (BPF_RET, 0, 0, SECCOMP_EPERM),
               (BPF_LD_ABS_W, 0, 0, 0), (BPF_JGE, 0, 1, X32_BIT), (BPF_RET, 0, 0, SECCOMP_EPERM)]
    for number in numbers:
        program += [(BPF_JEQ, 0, 1, number), (BPF_RET, 0, 0, SECCOMP_EPERM)]
    program.append((BPF_RET, 0, 0, SECCOMP_ALLOW))
    filters = (_SockFilter * len(program))(*[_SockFilter(*line) for line in program])
    fprog = _SockFprog(len(program), filters)
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"launcher: seccomp filter refused: {os.strerror(errno)}")


def _read_config(fd: int) -> dict:
    """The judge's first message: its length in 8 bytes, then plain JSON (the files in base64)."""
    def read(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = os.read(fd, n - len(data))
            if not chunk:
                sys.exit("launcher: the judge closed the channel before sending the sandbox")
            data += chunk
        return data
    (size,) = struct.unpack(">Q", read(8))
    config = json.loads(read(size))
    config["files"] = {path: base64.b64decode(data) for path, data in config["files"].items()}
    return config


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def _mount(source, target, fstype, flags, data=None) -> None:
    encode = lambda s: None if s is None else s.encode()  # noqa: E731
    if _libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"launcher: mount on {target} failed: {os.strerror(errno)}")


def _build_root(config: dict) -> str:
    """A new root holding only what the worker may see (an allowlist, not a list of hiding
    places): a /dev of its own, small fresh tmpfs for /tmp, /var/tmp, /dev/shm and /run, and on
    top of them the system folders and Python's, each bound read-only, submounts included, at its
    own path (a Python under /tmp lands in the fresh /tmp); ag's own install covered; the
    judge's folders (``trees``) read-only in the sandbox; /proc read-only. Everything else on the machine (the graded tests, ag's source, other checkouts,
    other students, /home, /root) does not exist in it. It is staged on a tmpfs over /tmp, and
    what lies under the host's /tmp stays reachable through a handle taken before."""
    host_tmp = os.open(STAGE, os.O_PATH | os.O_DIRECTORY)
    _mount("tmpfs", STAGE, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=700")
    new_root = STAGE + "/root"
    os.mkdir(new_root)
    _mount("tmpfs", new_root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=755")
    _make_dev(new_root + "/dev")
    for path, options in config["scratch"]:
        os.makedirs(new_root + path, exist_ok=True)
        _mount("tmpfs", new_root + path, "tmpfs", MS_NOSUID | MS_NODEV, options)
    for path in config["allow"]:
        _bind_read_only(_reachable(path, host_tmp), new_root + path)
    for path in config["hide"]:  # what lies inside the allowed folders but is not the worker's (ag's install)
        _hide(new_root + path)
    for relative, source in config["trees"].items():  # the judge's folders: ag with the exercise stubbed
        _bind_read_only(_reachable(source, host_tmp), _inside(new_root + SANDBOX, relative))
    os.close(host_tmp)
    os.makedirs(new_root + "/proc")
    _mount("proc", new_root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _read_only(new_root + "/proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    return new_root


def _reachable(path: str, host_tmp: int) -> str:
    """``path`` as the launcher can reach it once the stage covers /tmp."""
    if path == STAGE or path.startswith(STAGE + "/"):
        return f"/proc/self/fd/{host_tmp}{path[len(STAGE):]}"
    return path


def _make_dev(dev: str) -> None:
    """A /dev of the worker's own: the harmless devices (null, zero, full, random, urandom) bound
    from the host's, the standard streams' links, an empty shm for its scratch tmpfs; nothing
    else (no mqueue, pts or disks: the host's /dev has submounts shared with every process)."""
    os.makedirs(dev)
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=755")
    for name in DEVICES:
        open(f"{dev}/{name}", "w").close()
        _mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND)
        _read_only(f"{dev}/{name}", MS_NOSUID | MS_NOEXEC)  # a device stays writable on a read-only mount
    for name, target in DEV_LINKS.items():
        os.symlink(target, f"{dev}/{name}")
    os.mkdir(f"{dev}/shm")
    _read_only(dev, MS_NOSUID | MS_NOEXEC)


def _bind_read_only(source: str, target: str) -> None:
    """``source`` at ``target``, read-only all the way down; a symlink (/bin -> usr/bin) is copied as a symlink."""
    if os.path.islink(source):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.symlink(os.readlink(source), target)
        return
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "w").close()
    _mount(source, target, None, MS_BIND | MS_REC)
    _read_only(target)


def _read_only(target: str, flags: int = 0) -> None:
    """The mount at ``target`` and every mount below it read-only, with ``flags`` (MS_NOSUID,
    MS_NODEV, MS_NOEXEC) added: a bind's own remount leaves its submounts writable."""
    attr = _MountAttr(attr_set=MOUNT_ATTR_RDONLY | (flags & (MS_NOSUID | MS_NODEV | MS_NOEXEC)))
    _libc.syscall.restype = ctypes.c_long
    done = _libc.syscall(ctypes.c_long(MOUNT_SETATTR), ctypes.c_int(AT_FDCWD), target.encode(),
                         ctypes.c_uint(AT_RECURSIVE), ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))
    if done != 0:
        _read_only_one_by_one(target, flags)  # kernels before 5.12 have no mount_setattr


def _read_only_one_by_one(target: str, flags: int = 0) -> None:
    """``_read_only`` by remounting each mount at or below ``target``, parents first, each keeping
    its own nosuid, nodev, noexec and atime flags."""
    for point, options in _mounts_at_or_below(target):
        kept = sum(flag for name, flag in KEPT_FLAGS.items() if name in options)
        _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags | kept)


def _mounts_at_or_below(target: str) -> list[tuple[str, set[str]]]:
    """(mount point, per-mount options) of the mounts at or below ``target``, from /proc/self/mountinfo."""
    target = os.path.realpath(target)
    found = []
    with open("/proc/self/mountinfo") as table:
        for line in table:
            fields = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            if point == target or point.startswith(target.rstrip("/") + "/"):
                found.append((point, set(fields[5].split(","))))
    return found


def _hide(path: str) -> None:
    """Cover a folder with an empty read-only tmpfs, or a file with /dev/null."""
    if os.path.isdir(path):
        _mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=755")
    elif os.path.exists(path):
        _mount("/dev/null", path, None, MS_BIND)


def _inside(root: str, relative: str) -> str:
    """``root``/``relative``, refused if it would lie outside ``root``."""
    path = os.path.join(root, relative)
    if os.path.relpath(path, root).startswith(".."):
        raise ValueError(f"launcher: {relative!r} is outside the sandbox")
    return path


def _write_files(root: str, files: dict) -> None:
    for relative, data in files.items():
        path = _inside(root, relative)
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        with open(path, "wb") as out:
            out.write(data)
        os.chmod(path, 0o644)


if __name__ == "__main__":
    main(int(sys.argv[1]))
