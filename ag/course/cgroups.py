"""The workers' control groups: all of one worker's processes share one memory and process budget.

Each worker gets ``ag-grade/<judge pid>-<n>`` (cgroup v2, or v1's memory and pids hierarchies),
made by its judge and removed when the worker is killed. A judge that dies mid-grade (SIGKILL)
cannot remove its own, so every judge first removes the groups of judges that are no longer
running, killing what is left in them. The group also measures: its memory peak is what all the
worker's processes held at once, read from outside, where student code cannot fake it.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

CGROUPS = Path("/sys/fs/cgroup")
PARENT = "ag-grade"
V1_CONTROLLERS = ("memory", "pids")


def make(name: str, memory: int, processes: int) -> list[Path]:
    """A new cgroup bounding the memory (``memory`` bytes, no swap) and the number of processes
    of everything one worker runs; [] where the cgroup file system cannot be written (some
    containers), where the rlimits still bound each process on its own."""
    made: list[Path] = []
    try:
        remove_stale()
        if _unified():
            parent = CGROUPS / PARENT
            parent.mkdir(exist_ok=True)
            for folder in (CGROUPS, parent):
                (folder / "cgroup.subtree_control").write_text("+memory +pids")
            made.append(parent / name)
            made[-1].mkdir()
            limits = {"memory.max": memory, "memory.swap.max": 0, "pids.max": processes}
        else:
            for controller in V1_CONTROLLERS:
                made.append(CGROUPS / controller / PARENT / name)
                made[-1].mkdir(parents=True)
            limits = {"memory.limit_in_bytes": memory, "memory.memsw.limit_in_bytes": memory, "pids.max": processes}
        for group in made:
            for file, value in limits.items():
                if (group / file).exists():
                    (group / file).write_text(str(value))
    except OSError:
        remove(made)
        return []
    return made


def remove(groups: list[Path]) -> None:
    """Kill every process left in ``groups`` and remove them."""
    for group in reversed(groups):
        for _ in range(50):  # its last processes may still be exiting
            try:
                group.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                for pid in _processes(group):
                    _kill(pid)
                time.sleep(0.02)


def remove_stale() -> list[Path]:
    """Remove the groups whose judge (the pid their name starts with) is no longer running; the
    groups removed. A judge that was killed mid-grade leaves its worker's group behind."""
    stale = [group for parent in parents() if parent.is_dir() for group in parent.iterdir()
             if group.is_dir() and not _judge_running(group.name)]
    remove(stale)
    return stale


class MemoryPeak:
    """The most memory a worker's group held at once, read from outside the worker: v1's
    ``memory.max_usage_in_bytes`` (``reset`` writes 0 to it), v2's ``memory.peak`` (``reset``
    writes to it, kernel 6.12 or later, and the reset holds for reads through the same open file)."""

    def __init__(self, groups: list[Path]) -> None:
        memory = [g / f for g in groups for f in ("memory.peak", "memory.max_usage_in_bytes") if (g / f).exists()]
        self.file = memory[0] if memory else None
        self.handle = None

    def reset(self) -> bool:
        """Count from what the group holds now; False where this kernel cannot."""
        if self.file is None:
            return False
        try:
            if self.file.name == "memory.peak":
                self.close()
                self.handle = open(self.file, "r+")
                self.handle.write("reset\n")
                self.handle.flush()
            else:
                self.file.write_text("0")
        except OSError:
            self.close()
            return False
        return True

    def read(self) -> int | None:
        """Bytes at the peak since the group was made or last reset; None where it cannot be read."""
        try:
            if self.handle is not None:
                self.handle.seek(0)
                return int(self.handle.read().split()[0])
            return int(self.file.read_text().split()[0]) if self.file is not None else None
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None


def parents() -> list[Path]:
    """The folders that hold the workers' groups: one in cgroup v2, one per controller in v1."""
    return [CGROUPS / PARENT] if _unified() else [CGROUPS / c / PARENT for c in V1_CONTROLLERS]


def _unified() -> bool:
    return (CGROUPS / "cgroup.controllers").exists()


def _judge_running(name: str) -> bool:
    """Whether the judge that named a group ``<pid>-<n>`` still runs (a name of another form is kept)."""
    pid, dash, number = name.partition("-")
    if not (pid.isdigit() and dash and number.isdigit()):
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _processes(group: Path) -> list[int]:
    try:
        return [int(p) for p in (group / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
