"""Per-student limits without systemd: one control group per student server.

Where systemd runs, the hub uses jupyterhub-systemdspawner, which puts each server in a systemd unit
with MemoryMax and CPUQuota. Where it does not (a container, a board image without systemd), the
nearest honest equivalent is what systemd itself does underneath: a control group (cgroup) per
student, made by the hub (root) and joined by the server before it drops to the student's user.
Every process the student starts (a kernel, a terminal, a fork bomb) inherits it, so:

- memory: the kernel's OOM killer acts inside the group when it passes its cap, killing that
  student's largest process, never another student's or the hub's;
- CPU: each group has the same weight (cgroup v1 cpu.shares, v2 cpu.weight) and a quota of
  ``cpus`` cores, so a student running ten busy processes gets one student's share;
- processes: a cap on tasks (pids.max) stops a fork bomb at that number.

Both cgroup versions are handled: v2 (one unified hierarchy) and v1 (one hierarchy per controller,
as on older kernels and some container hosts). With neither writable, ``Limits.fallback`` says so
and the spawner falls back to per-process resource limits (setrlimit): RLIMIT_AS caps each process,
not the server's sum, and RLIMIT_NPROC counts the student's processes: weaker, and the hub's log
says which mode it is in.
"""
from __future__ import annotations

import os
import resource
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
GROUP = "flash-attn-class"  # the folder under which every student's group is made


def _own_path(controller: str | None) -> str:
    """This process's cgroup path in one hierarchy (``None``: the unified v2 one), from /proc/self/cgroup."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (controller is None and controllers == "") or (controller and controller in controllers.split(",")):
            return path.lstrip("/")
    raise OSError(f"no {controller or 'unified'} cgroup in /proc/self/cgroup")


def _writable_dir(path: Path) -> bool:
    try:
        path.mkdir(exist_ok=True)
        probe = path / f"probe-{os.getpid()}"
        probe.mkdir()
        probe.rmdir()
        return True
    except OSError:
        return False


class Limits:
    """The cgroup layout of this machine, found once when the hub starts."""

    def __init__(self, memory_bytes: int, cpus: float, max_tasks: int):
        self.memory_bytes, self.cpus, self.max_tasks = memory_bytes, cpus, max_tasks
        self.version, self.bases = self._find()

    @property
    def fallback(self) -> bool:
        return self.version is None

    def describe(self) -> str:
        mem = f"{self.memory_bytes / 2**30:.1f} GiB"
        if self.fallback:
            return (f"no writable cgroup: per-process limits only (RLIMIT_AS {mem} per process, "
                    f"RLIMIT_NPROC {self.max_tasks} per student, nice 5)")
        return (f"cgroup v{self.version}: memory {mem}, CPU {self.cpus:g} cores at equal weight, "
                f"{self.max_tasks} tasks per student server")

    def _find(self):
        # v2: the unified hierarchy is mounted at the root (cgroup.controllers exists there); our
        # folder sits at its top, where a root process without systemd may make it
        if (ROOT / "cgroup.controllers").is_file():
            base = ROOT / GROUP
            if _writable_dir(base):
                try:  # let the students' groups use the controllers (the root's subtree, then ours)
                    for folder in (ROOT, base):
                        (folder / "cgroup.subtree_control").write_text("+memory +cpu +pids")
                    return 2, {"unified": base}
                except OSError:
                    pass
        # v1: one hierarchy per controller, each mounted under /sys/fs/cgroup/<controller>
        bases = {}
        for controller in ("memory", "cpu", "pids"):
            mount = ROOT / controller
            if not mount.is_dir():
                continue
            try:
                base = mount / _own_path(controller) / GROUP
            except OSError:
                continue
            if _writable_dir(base):
                bases[controller] = base
        if "memory" in bases and "pids" in bases:
            return 1, bases
        return None, {}

    def _groups(self, name: str) -> dict[str, Path]:
        return {controller: base / name for controller, base in self.bases.items()}

    def prepare(self, name: str) -> None:
        """Make (or reset) the group of the student server ``name`` with the limits."""
        if self.fallback:
            return
        quota_period = 100_000  # microseconds, the kernel's default period
        quota = int(self.cpus * quota_period)
        for controller, group in self._groups(name).items():
            group.mkdir(exist_ok=True)
            files = {
                "unified": {"memory.max": self.memory_bytes, "memory.swap.max": 0,
                            "cpu.weight": 100, "cpu.max": f"{quota} {quota_period}", "pids.max": self.max_tasks},
                # memsw (memory + swap) after the memory limit it may not be below: with swap on,
                # a group capped in memory alone would swap instead of meeting its cap
                "memory": {"memory.limit_in_bytes": self.memory_bytes, "memory.memsw.limit_in_bytes": self.memory_bytes},
                "cpu": {"cpu.shares": 1024, "cpu.cfs_period_us": quota_period, "cpu.cfs_quota_us": quota},
                "pids": {"pids.max": self.max_tasks},
            }[controller]
            for fname, value in files.items():
                try:
                    (group / fname).write_text(str(value))
                except OSError:
                    if fname not in ("memory.swap.max", "memory.memsw.limit_in_bytes"):
                        raise  # the swap files are absent where the kernel accounts no swap

    def join(self, name: str) -> None:
        """Put the calling process into the group ``name`` (called in the child, as root, before it
        becomes the student); in fallback mode set the per-process limits instead."""
        if self.fallback:
            resource.setrlimit(resource.RLIMIT_AS, (self.memory_bytes, self.memory_bytes))
            resource.setrlimit(resource.RLIMIT_NPROC, (self.max_tasks, self.max_tasks))
            os.nice(5)
            return
        for group in self._groups(name).values():
            (group / "cgroup.procs").write_text(str(os.getpid()))

    def tasks(self, name: str) -> list[int]:
        """The processes still in the group ``name``."""
        pids = set()
        for group in self._groups(name).values():
            try:
                pids.update(int(p) for p in (group / "cgroup.procs").read_text().split())
            except OSError:
                pass
        return sorted(pids)

    def release(self, name: str, grace_s: float = 5.0) -> list[int]:
        """End whatever the student server ``name`` left running (a kernel that outlived its server,
        a background job, a fork bomb's children) and remove its group. Returns the pids that had
        to be killed."""
        if self.fallback:
            return []
        left = self.tasks(name)
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, grace_s)):
            for pid in self.tasks(name):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while self.tasks(name) and time.monotonic() < deadline:
                time.sleep(0.1)
        for group in self._groups(name).values():
            try:
                group.rmdir()
            except OSError:
                pass
        return left

    def remove_base(self) -> None:
        """Remove the (empty) folders under which the students' groups were made."""
        for base in self.bases.values():
            try:
                base.rmdir()
            except OSError:
                pass
