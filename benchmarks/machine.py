"""What every benchmark result records about where it ran (no TensorFlow import here).

`machine_info()` returns the CPU model, core count, memory, GPU (from
`nvidia-smi` when present), library versions, the git commit with any
uncommitted library files, and the load average: a result measured while
other processes were busy says so.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata

_VERSIONED = ("tensorflow", "tf-keras", "dp-accounting", "tensorflow-privacy", "numpy")


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return ""


def meminfo_kb(field: str) -> int | None:
    """A field of /proc/meminfo (e.g. "MemTotal", "MemAvailable") in KiB, None if absent."""
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


def cpu_model() -> str:
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def gpu_names() -> list[str]:
    """GPU names from `nvidia-smi -L`; empty when there is no NVIDIA GPU."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def versions() -> dict:
    found = {"python": platform.python_version()}
    for name in _VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def git_state(repo: str, paths: tuple = ("tfdp_embed",)) -> dict:
    """HEAD commit and the uncommitted (modified or untracked) files under `paths`."""

    def git(*args):
        try:
            out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return ""
        return out.stdout if out.returncode == 0 else ""

    status = git("status", "--porcelain", "--", *paths)
    return {
        "commit": git("rev-parse", "HEAD").strip() or "unknown",
        "uncommitted_library_files": sorted(line[3:] for line in status.splitlines() if line.strip()),
    }


def tree_digest(root: str, suffixes: tuple = (".py", ".cc", ".h")) -> str:
    """Short sha1 of every source file under `root` (path and bytes): tells whether the library
    changed between two worker processes of one run (others may be editing the checkout)."""
    digest = hashlib.sha1()
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(suffixes):
                path = os.path.join(directory, name)
                digest.update(os.path.relpath(path, root).encode())
                try:
                    with open(path, "rb") as handle:
                        digest.update(handle.read())
                except OSError:
                    digest.update(b"<unreadable>")
    return digest.hexdigest()[:12]


def busy_processes(limit: int = 6, exclude: set | None = None) -> list[str]:
    """The processes using the most CPU right now (`ps`), as 'pcpu% rssMB command' strings."""
    exclude = exclude or set()
    try:
        out = subprocess.run(
            ["ps", "-eo", "pid=,pcpu=,rss=,args=", "--sort=-pcpu"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = []
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) < 4 or int(parts[0]) in exclude or parts[3].startswith("ps "):
            continue
        if float(parts[1]) < 5.0:
            break
        rows.append(f"{float(parts[1]):.0f}% {int(parts[2]) // 1024} MB {parts[3][:90]}")
        if len(rows) >= limit:
            break
    return rows


def machine_info(repo: str) -> dict:
    """Everything BENCHMARKS.md asks a result to record about the machine."""
    total_kb = meminfo_kb("MemTotal") or 0
    available_kb = meminfo_kb("MemAvailable") or 0
    return {
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "hostname": platform.node(),
        "nproc": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_total_gb": round(total_kb / 2**20, 1),
        "memory_available_gb_at_start": round(available_kb / 2**20, 1),
        "cpu_model": cpu_model(),
        "gpus": gpu_names(),
        "platform": platform.platform(),
        "python_executable": sys.executable,
        "versions": versions(),
        "git": git_state(repo),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "busy_processes_at_start": busy_processes(exclude={os.getpid()}),
    }


# -- process memory (Linux /proc; 0 / NaN where unreadable) ------------------------
def status_kb(field: str, pid: int | str = "self") -> int:
    """A `/proc/<pid>/status` field in kB (e.g. "VmRSS", "VmHWM"); 0 if unreadable."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def reset_peak_rss() -> bool:
    """Resets this process's VmHWM (Linux >= 4.0: write 5 to clear_refs) so peaks are per phase."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="utf-8") as handle:
            handle.write("5")
        return True
    except OSError:
        return False
