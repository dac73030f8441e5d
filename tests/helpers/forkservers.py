"""Live multiprocessing fork servers (the finder's probe server), found through /proc."""

from pathlib import Path


def forkservers(parent: int | None = None, marker: str | None = None) -> list[int]:
    """Pids of live fork servers: children of `parent`, or with `marker` in their environment."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"multiprocessing.forkserver" not in (proc / "cmdline").read_bytes():
                continue
            status = (proc / "status").read_text()
            if "\nState:\tZ" in status:  # ended, not yet reaped
                continue
            ppid = int(next(line for line in status.splitlines() if line.startswith("PPid:")).split()[1])
            if parent is not None and ppid != parent:
                continue
            if marker is not None and marker.encode() not in (proc / "environ").read_bytes():
                continue
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        found.append(int(proc.name))
    return found
