"""The machine's cores, shared between the bsexp runs that train on it at once.

torch takes every core for its thread pool by default, and processes whose threads outnumber the
cores spin against each other: two default runs started together on 2 cores each took x34 the
time of one alone at one thread (issue 54: 68 s each against 2.0 s; the same two at one thread
each, 1.6 and 1.9 s). So every training process enters a registry (one locked file per process,
in the temporary directory, or BSEXP_CORES_REGISTRY) with its threads, and a run whose threads are
not pinned takes its share of the cores beside the others: when it starts, and while it trains
(a thread looks at the registry every half second; the training loop applies what it found
between two steps, since OpenMP keeps the thread count per thread and torch.set_num_threads
called from the looking thread would change only that thread's). When the others leave, the run
takes its cores back.

A pinned run (trainer.threads, OMP_NUM_THREADS, trainer.speed=reproducible) is counted, never
moved: the thread count changes the rounding of a run's sums, so a run is bit-reproducible only
at a pinned count. One pinned at torch's default that finds the cores oversubscribed is told
the share that would let each run near its speed alone. Programs other than bsexp are not seen.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bsexp.system.registry import Entry, others, registry_dir

LOOK_EVERY_S = 0.5  # how often a sharing run reads the registry: a run started beside it waits this long at most
_HELD: list[int] = []  # this process's registration, locked for as long as it lives
_DEFAULT: list[int] = []  # torch's thread count in this process before any run moved it

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sharing:
    """What the registry says: this process's threads, the other training processes'."""

    cores: int
    threads: int
    others: tuple[Entry, ...]

    @property
    def oversubscribed(self) -> bool:
        return self.threads + sum(o.threads for o in self.others) > self.cores

    @property
    def share(self) -> int:
        """Threads each process would have with the cores divided evenly."""
        return max(1, self.cores // (1 + len(self.others)))

    def fair(self, pid: int, ceiling: int) -> int:
        """The threads of a sharing run (process `pid`): the cores the pinned runs leave, divided
        evenly between the runs that share (a remainder to the earliest pids, one core each), at
        least 1 and at most `ceiling` (torch's default, or a DDP worker's part of the node)."""
        pinned = sum(o.threads for o in self.others if not o.shares)
        sharers = sorted([pid, *(o.pid for o in self.others if o.shares)])
        each, left = divmod(max(self.cores - pinned, 0), len(sharers))
        return max(1, min(ceiling, each + (sharers.index(pid) < left)))

    def describe(self) -> str:
        n = len(self.others)
        if not n:
            return f"no other bsexp run trains on this machine's {self.cores} cores"
        runs = f"{n} other bsexp run{'s' if n > 1 else ''} train{'' if n > 1 else 's'}"
        return f"{runs} on this machine's {self.cores} cores"


def cores() -> int:
    """The cores this process may run on (its affinity, as torch sees them)."""
    return len(os.sched_getaffinity(0))


def default_threads() -> int:
    """torch's thread count in this process before a run moved it (a sweep's next point in the same
    process finds the count the last one left): what a sharing run may take at most."""
    if not _DEFAULT:
        _DEFAULT.append(torch.get_num_threads())
    return _DEFAULT[0]


def register(threads: int, shares: bool = False, registry: Path | None = None) -> Sharing:
    """Enter this process (training with `threads` threads; 0: not training) in the registry, then
    read who else is there. The entry is locked before it gets its name, so a reader never takes a
    live process's entry for a dead one's; a dead process's lock is gone, and its entry is removed."""
    registry = registry or registry_dir()
    registry.mkdir(parents=True, exist_ok=True)
    text = f"{threads} {'shares' if shares else 'pinned'}".encode()
    if _HELD:  # a process that trains again (the points of a sweep run one after another)
        os.ftruncate(_HELD[0], 0)
        os.pwrite(_HELD[0], text, 0)
    else:
        draft = registry / f".{os.getpid()}"
        handle = os.open(draft, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        fcntl.flock(handle, fcntl.LOCK_EX)
        _HELD.append(handle)
        os.write(handle, text)
        os.replace(draft, registry / str(os.getpid()))
    # Read after entering: of two runs started at the same instant, the later to read sees the other.
    return Sharing(cores(), threads, others(registry))


@dataclass(kw_only=True, eq=False)
class Threads:
    """A run's CPU threads: pinned, or its share of the cores beside the machine's other bsexp runs
    (`shares`), which a looking thread finds (`wanted`) and the training loop applies between
    steps. `changes`: (step, threads) wherever the count moved while the run trained."""

    threads: int  # in force now
    shares: bool = False
    ceiling: int = 0  # the most a sharing run takes
    tell: bool = False  # a pinned run at torch's default: say when the cores are oversubscribed
    registry: Path | None = None  # None: not entered (a run on a GPU, a loop built for a probe)
    first: int = 0  # the count the run started with
    changes: list[tuple[int, int]] = field(default_factory=list)
    wanted: tuple[int, Sharing | None] = (0, None)  # set by the looking thread, read by the loop
    no_more: bool = False  # under a memory cap: lowered only, since a thread started anew needs room

    def __post_init__(self) -> None:
        self.first = self.threads
        self.wanted = (self.threads, None)

    def between_steps(self, step: int) -> None:
        """Apply the count the looking thread found, at this step boundary (on the training thread)."""
        threads, sharing = self.wanted
        if threads == self.threads or (self.no_more and threads > self.threads):
            return
        log.info("threads: %d -> %d at step %d (%s)", self.threads, threads, step, sharing.describe())
        torch.set_num_threads(threads)
        self.threads = threads
        self.changes.append((step, threads))
        register(threads, True, self.registry)

    def look(self) -> bool:
        """On the looking thread: read the registry; False once there is nothing more to look for."""
        sharing = Sharing(cores(), self.threads, others(self.registry))
        if self.shares:
            self.wanted = (sharing.fair(os.getpid(), self.ceiling), sharing)
            return True
        if sharing.oversubscribed:
            tell_share(sharing)
            return False
        return True

    @contextlib.contextmanager
    def watching(self) -> Iterator[Callable[[], None]]:
        """While the block runs (training), look at the registry on a thread of its own. The block
        gets a function that ends the looking before the block ends (training done, the summary
        still to write) and marks this process as no longer training, so the others take its cores."""
        looks = self.registry is not None and (self.shares or self.tell)
        done = threading.Event()

        def finish() -> None:
            done.set()
            if self.registry is not None:
                register(0, self.shares, self.registry)

        watcher = threading.Thread(target=self._look_until, args=(done,), name="bsexp-cores", daemon=True)
        if looks:
            watcher.start()
        try:
            yield finish
        finally:
            finish()
            if looks:
                watcher.join()

    def _look_until(self, done: threading.Event) -> None:
        every = LOOK_EVERY_S if self.shares else 4 * LOOK_EVERY_S
        while not done.wait(every):
            try:
                if not self.look():
                    return
            except Exception:  # noqa: BLE001 - a run out of memory, say: the run's error is its own to report
                return


def take_threads(*, pinned: int | None, tell: bool = False, registry: Path | None = None) -> Threads:
    """This run's threads, entered in the registry and set in torch: `pinned` where given, else its
    share beside the other bsexp runs (said in the log where it is less than torch's default).
    `tell`: a pinned run at torch's default, told when the cores are oversubscribed."""
    ceiling, registry = default_threads(), registry or registry_dir()
    if pinned is not None:
        torch.set_num_threads(pinned)
        sharing = register(pinned, False, registry)
        if tell and sharing.oversubscribed:
            tell_share(sharing)
            tell = False
        return Threads(threads=pinned, ceiling=pinned, tell=tell, registry=registry)
    sharing = register(ceiling, True, registry)
    threads = sharing.fair(os.getpid(), ceiling)
    if threads < ceiling:
        log.info(
            "threads: %d of torch's %d (%s; trainer.threads=N pins the count)", threads, ceiling, sharing.describe()
        )
    torch.set_num_threads(threads)
    register(threads, True, registry)
    return Threads(threads=threads, shares=True, ceiling=ceiling, registry=registry)


def tell_share(sharing: Sharing) -> None:
    log.warning(
        "%s beside this one (%d threads here, %d there): each runs several times slower than alone "
        "(x34 measured for two runs on 2 cores); leave trainer.threads and trainer.speed unset and bsexp "
        "shares the cores, or give each its share with trainer.threads=%d",
        sharing.describe(),
        sharing.threads,
        sum(o.threads for o in sharing.others),
        sharing.share,
    )
