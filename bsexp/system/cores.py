"""The machine's cores, shared between bsexp runs that train on it at once.

torch takes every core for its thread pool by default, so two runs started side by side each
run several times slower than alone (2 cores: 2.3 s of training alone, 7.6 s each two at once, 2.6 s
each with trainer.threads=1; docs/results/performance.md measured x8.5 on a larger run). Every
training process says so in a registry (one locked file per process, in the temporary directory),
and a run whose threads are torch's default is told, when others are training (when it starts, or
later: it keeps looking while it trains), how many threads would give each its share. It is told,
not changed: the thread count can change the rounding of a run's sums, and a run is reproducible
by default.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

REGISTRY = Path(tempfile.gettempdir()) / "bsexp-runs"
_HELD: list[int] = []  # this process's registration, locked for as long as it lives


@dataclass(frozen=True)
class Sharing:
    """What the registry says: this process's threads, the other training processes' threads."""

    cores: int
    threads: int
    others: tuple[int, ...]

    @property
    def oversubscribed(self) -> bool:
        return self.threads + sum(self.others) > self.cores

    @property
    def share(self) -> int:
        """Threads each process would have with the cores divided evenly."""
        return max(1, self.cores // (1 + len(self.others)))


def cores() -> int:
    """The cores this process may run on (its affinity, as torch sees them)."""
    return len(os.sched_getaffinity(0))


def register(threads: int, registry: Path = REGISTRY) -> Sharing:
    """Enter this process (training with `threads` threads) in the registry, then read who else is
    there. The entry is locked before it gets its name, so a reader never takes a live process's
    entry for a dead one's; a dead process's lock is gone, and its entry is removed."""
    registry.mkdir(parents=True, exist_ok=True)
    if _HELD:  # a process that trains again (the points of a sweep run one after another)
        os.ftruncate(_HELD[0], 0)
        os.pwrite(_HELD[0], str(threads).encode(), 0)
    else:
        draft = registry / f".{os.getpid()}"
        handle = os.open(draft, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        fcntl.flock(handle, fcntl.LOCK_EX)
        _HELD.append(handle)
        os.write(handle, str(threads).encode())
        os.replace(draft, registry / str(os.getpid()))
    # Read after entering: of two runs started at the same instant, the later to read sees the other.
    return Sharing(cores(), threads, others(registry))


def others(registry: Path = REGISTRY) -> tuple[int, ...]:
    """The threads of every other live training process in the registry."""
    found = []
    for entry in registry.glob("[0-9]*"):
        if entry.name == str(os.getpid()):
            continue
        with contextlib.suppress(OSError, ValueError):
            found.append(_live_threads(entry))
    return tuple(t for t in found if t)


@contextlib.contextmanager
def watching(
    threads: int, tell: Callable[[Sharing], None], every: float = 2.0, registry: Path = REGISTRY
) -> Iterator[Callable[[], None]]:
    """While the block runs, look at the registry every `every` seconds and `tell` once where runs
    started since ask for more threads than there are cores (the run that started first is told
    too, not only the one that found the other there). The block gets a function that stops the
    looking before it ends (a run's training done, its summary still to write)."""
    done = threading.Event()

    def look() -> None:
        while not done.wait(every):
            try:
                sharing = Sharing(cores(), threads, others(registry))
            except Exception:  # noqa: BLE001 - a run out of memory, say: the run's error is its own to report
                return
            if sharing.oversubscribed:
                tell(sharing)
                return

    watcher = threading.Thread(target=look, name="bsexp-cores", daemon=True)
    watcher.start()
    try:
        yield done.set  # to stop looking before the block ends
    finally:
        done.set()
        watcher.join()


def _live_threads(entry: Path) -> int:
    """The threads of a live process's entry; 0 for a dead process's, which is removed."""
    handle = os.open(entry, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # held: the process lives
        return int(os.read(handle, 16) or b"1")
    else:
        entry.unlink(missing_ok=True)
        return 0
    finally:
        os.close(handle)
