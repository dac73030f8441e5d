"""Files written whole or not at all: to a temporary name beside the target, then renamed, so a
reader (a resumed run, a sweep's report, a concurrent job) never sees half a file. A write that
fails leaves no temporary file behind; one the disk had no room for is a `DiskFull` that names
the file and the space it needs."""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

# What a full disk (or a quota, or a file-size cap) raises from a write.
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# The temporary name of `atomic_write`: `.<name>.<pid>.tmp` beside the file.
_TEMPORARY = re.compile(r"^\..+\.\d+\.tmp$")


class DiskFull(OSError):
    """A write the disk had no room for: the file, the bytes it needs, the bytes free there."""

    def __init__(self, path: Path, needed: int | None, code: int = errno.ENOSPC, free: int | None = None) -> None:
        super().__init__(code, os.strerror(code), str(path))
        self.path, self.needed = Path(path), needed
        self.free = free_bytes(self.path.parent) if free is None else free

    def __reduce__(self):  # crosses process boundaries (a DDP worker's error, to its launcher)
        return DiskFull, (self.path, self.needed, self.errno, self.free)

    def __str__(self) -> str:
        what = {errno.EDQUOT: "the disk quota is used up", errno.EFBIG: "a file-size limit is reached"}
        need = f"needs {_mb(self.needed)}" if self.needed is not None else "needs more room"
        free = f", {_mb(self.free)} free there" if self.free is not None and self.errno == errno.ENOSPC else ""
        return f"{what.get(self.errno, 'the disk is full')}: writing {self.path} {need}{free} ({self.strerror})"


def _mb(size: int) -> str:
    return f"{size / 2**20:.2f} MB" if size >= 2**14 else f"{size} bytes"


def free_bytes(directory: Path) -> int | None:
    """The bytes an unprivileged process may still write on `directory`'s filesystem."""
    try:
        stat = os.statvfs(directory)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def no_room(exc: BaseException | None) -> OSError | None:
    """The write that found no room (a full disk, a quota, a file-size cap) where `exc` is one, or
    was raised from one (torch.save's own error is raised while handling its write's), else None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError) and exc.errno in _NO_ROOM:
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


class _Counting:
    """A sink that only counts what is written to it (seeks included): the size of a file."""

    def __init__(self) -> None:
        self.at = self.size = 0

    def write(self, data) -> int:
        self.at += memoryview(data).nbytes
        self.size = max(self.size, self.at)
        return memoryview(data).nbytes

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.at = {os.SEEK_SET: 0, os.SEEK_CUR: self.at, os.SEEK_END: self.size}[whence] + offset
        return self.at

    def tell(self) -> int:
        return self.at

    def flush(self) -> None:
        pass


def size_of(write: Callable[[BinaryIO], None]) -> int | None:
    """The size of the file `write` writes, written nowhere; None where it cannot say."""
    counter = _Counting()
    try:
        write(counter)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - a help to the message about a full disk, never a new error
        return None
    return counter.size


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def reserve(path: Path, size: int) -> bool:
    """Keep `size` bytes for a later `atomic_write` of `path` by this process: its temporary file,
    made now and allocated on disk, which that write takes over (a file that must be written
    whatever ends the run: its summary, after a full disk). False where nothing could be kept."""
    tmp = _temporary(Path(path))
    try:
        with open(tmp, "wb") as out:
            try:
                os.posix_fallocate(out.fileno(), 0, size)
            except OSError as exc:  # a filesystem that does not allocate ahead: written out
                if no_room(exc) is not None:
                    raise
                out.write(bytes(size))
        return True
    except OSError:
        tmp.unlink(missing_ok=True)
        return False


def atomic_write(path: Path, write: Callable[[BinaryIO], None], durable: bool = False) -> Path:
    """`write` fills a temporary file, which then replaces `path`. `durable`: flushed to disk
    first, and the rename itself too (checkpoints: a crash leaves the previous file). A write that
    fails removes its temporary file; one that found no room raises DiskFull."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    try:
        # Not truncated first: a reserved one's room is written over, then cut to what was written.
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT, 0o644), "wb") as out:
            write(out)
            out.truncate()
            if durable:
                out.flush()
                os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if (full := no_room(exc)) is not None:
            raise DiskFull(path, size_of(write), full.errno) from None
        raise
    if durable:
        sync_directory(path.parent)
    return path


def sync_directory(directory: Path) -> None:
    """Make the names in `directory` (a rename, a new file) durable, as its files' contents are."""
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def remove_leftovers(directory: Path) -> list[Path]:
    """Remove the temporary files that writes into `directory` (and below it) left when their
    process was killed mid-write; the files removed. Only while no other process writes there:
    a run holds its directory's lock (bsexp.train.preflight)."""
    removed = []
    for path in Path(directory).rglob(".*.tmp"):
        if _TEMPORARY.match(path.name) and path.is_file():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def atomic_write_text(path: Path, text: str) -> Path:
    return atomic_write(path, lambda out: out.write(text.encode("utf-8")))


def write_json(path: Path, obj: dict[str, Any]) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


class Unreadable(ValueError):
    """A file missing, cut short, not JSON, or not the JSON object it should hold; the message
    names the file and which."""


def read_json_object(path: Path, what: str = "JSON object") -> dict[str, Any]:
    """The JSON object a file holds (`what` it should be, for the message), or Unreadable."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Unreadable(f"{path} cannot be read ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise Unreadable(f"{path} holds no {what} (a JSON object): it holds {type(data).__name__}")
    return data
