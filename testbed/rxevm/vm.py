"""Boot a throw-away VM with virtme-ng and run one command in it (the thin VM shell).

``vng --run /boot/vmlinuz-<ver> --disable-kvm`` boots the host's own Debian kernel on the
host's root filesystem (read-only, with overlays) under software emulation and runs the
command as root; ``--rwdir`` makes one host folder writable, which is how results come back.
KVM is not used: the nested guest hangs at boot on this kind of machine (see
``../shared/FIELD-NOTES.md``), and software emulation needs nothing but qemu. A boot takes
~25 s on an idle core and more on a busy one: callers boot once and run several checks.

`vm_unavailable` says why a VM cannot run here (None when it can); `run_in_vm` starts ``vng``
in its own process group and kills that group (by the PID it started) on timeout or error;
`start_in_vm` starts it and returns a `VmRun` to wait for or kill later.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BOOT = Path("/boot")


class VmError(RuntimeError):
    """The VM could not be started or did not finish in time."""


@dataclass(frozen=True, slots=True)
class VmResult:
    """What a VM run returned: exit code of ``vng``, its output, wall seconds."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float


def tool_path() -> str:
    """Return PATH with this interpreter's bin folder first (``vng`` needs ``virtme-run``)."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def find_kernel(boot: Path = BOOT) -> Path | None:
    """Return the newest ``vmlinuz-*`` in ``boot`` whose modules are installed, or None."""
    kernels = sorted(boot.glob("vmlinuz-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for k in kernels:
        if Path("/lib/modules", k.name.removeprefix("vmlinuz-")).is_dir():
            return k
    return None


def vm_unavailable(boot: Path = BOOT) -> str | None:
    """Return why no VM can run here (missing tool, kernel or module), or None if one can."""
    path = tool_path()
    for tool in ("vng", "virtme-run", "qemu-system-x86_64"):
        if shutil.which(tool, path=path) is None:
            return f"{tool} not found (run make setup: .ci/setup installs it)"
    kernel = find_kernel(boot)
    if kernel is None:
        return "no /boot/vmlinuz-* with modules in /lib/modules (install linux-image-amd64)"
    ver = kernel.name.removeprefix("vmlinuz-")
    mods = Path("/lib/modules", ver)
    if not any(mods.rglob("rdma_rxe.ko*")):
        return f"kernel {ver} has no rdma_rxe module"
    return None


def vng_command(kernel: Path, command: str, rwdir: Path, memory: str = "1G") -> list[str]:
    """Return the ``vng`` argv that boots ``kernel`` and runs ``command`` (pure)."""
    return ["vng", "--run", str(kernel), "--disable-kvm", "--memory", memory, "--cpus", "1",
            "--user", "root", "--rwdir", str(rwdir), "--exec", command]  # fmt: skip


class VmRun:
    """A started ``vng`` run (`start_in_vm`): `wait` for its result, or `kill` it."""

    def __init__(self, proc: subprocess.Popen[str], began: float) -> None:
        self._proc, self._began = proc, began

    def wait(self, timeout_s: float) -> VmResult:
        """Wait up to ``timeout_s`` more seconds and return what ``vng`` returned. Raises
        `VmError` on timeout (the VM is killed first); any other exception kills it too."""
        try:
            out, err = self._proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(self._proc)
            out, err = self._proc.communicate()
            raise VmError(f"VM run did not finish within {timeout_s:.0f} s; stderr tail: "
                          f"{(err or '')[-400:]!r}") from None  # fmt: skip
        except BaseException:
            _kill_group(self._proc)
            raise
        return VmResult(self._proc.returncode, out, err, time.monotonic() - self._began)

    def kill(self) -> None:
        """Kill the run's process group if it is still running (by the PID it started)."""
        _kill_group(self._proc)
        self._proc.communicate()


def start_in_vm(command: str, rwdir: Path, *, memory: str = "1G") -> VmRun:
    """Start booting a VM that runs the shell ``command`` as root (``rwdir``, an existing
    host folder, is writable in the guest) and return at once. Raises `VmError` if no VM can
    run here."""
    reason = vm_unavailable()
    if reason is not None:
        raise VmError(reason)
    kernel = find_kernel()
    assert kernel is not None
    env = {**os.environ, "PATH": tool_path()}
    began = time.monotonic()
    proc = subprocess.Popen(
        vng_command(kernel, command, rwdir, memory), env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    return VmRun(proc, began)


def run_in_vm(command: str, rwdir: Path, *, timeout_s: float, memory: str = "1G") -> VmResult:
    """Boot a VM, run the shell ``command`` in it as root and return what ``vng`` returned.

    ``rwdir`` (an existing host folder) is writable in the guest. Raises `VmError` if no VM
    can run here or the run takes longer than ``timeout_s`` (the VM is killed first).
    """
    return start_in_vm(command, rwdir, memory=memory).wait(timeout_s)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """Kill the process group led by ``proc`` (vng, qemu and helpers it started)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
