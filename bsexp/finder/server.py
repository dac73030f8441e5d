"""The process the CPU finder's probe processes fork from (multiprocessing's forkserver). It
imports torch and bsexp once, so a probe process starts in a fraction of a second instead of the
seconds a fresh interpreter takes, and restarting one after a failure costs as little. It never
runs a torch operation (no thread pools, no oneDNN state), so forking from it is safe where
forking from the training process would not be. Torch-free at import: bsexp.train.preflight starts it
before the run's own process imports torch, so that the two imports overlap."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.forkserver
import os
import signal

# What a probe process needs imported before it starts: torch and bsexp's finder, torch._dynamo
# (an optimizer's first parameter group imports it, ~1 s), and what the entry point imports
# (Hydra's, ~0.25 s): multiprocessing runs the entry point again in every child as `__mp_main__`.
# Not the entry point itself: runpy warns when the module it runs was imported already.
PRELOAD = [
    "bsexp.finder.probe",
    "torch._dynamo",
    "hydra.main",
    "hydra.core.hydra_config",
    "bsexp.config.env",
    "bsexp.runs.resume",
    "bsexp.runs.sweep",
]

CACHE_CAPACITY = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"  # kernels oneDNN keeps (1,024 unless set; 0: none)

_started_here = False


def start() -> None:
    """Start the server unless it runs; returns at once (it imports in the background)."""
    global _started_here
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    if multiprocessing.forkserver._forkserver._forkserver_pid is None:  # not one another part started
        _started_here = True
    # oneDNN keeps the kernels it compiles for every input shape (~10-20 MB a shape for a conv
    # net): a probe process tries many shapes, training one or two, so each trial would leave the
    # next less room than training has. Without that cache every trial starts alike; what
    # training's cache will hold is measured once, in a process that turns it back on
    # (probe._kernel_cache), and left out of the trials' room. The server's environment is
    # its children's. The probe processes are capped, so they allocate from one arena (see
    # bsexp.system.memory.one_arena).
    with _environ(**{CACHE_CAPACITY: "0"}, MALLOC_ARENA_MAX="1"):
        multiprocessing.forkserver.ensure_running()


def stop() -> None:
    """Stop the server if `start` started it (its ~0.3 GB are not the training's to share), at
    once: it holds nothing to save, and may still be importing (a run that failed its checks)."""
    global _started_here
    if not _started_here:
        return
    forkserver = multiprocessing.forkserver._forkserver  # the module has no public way to stop it
    if forkserver._forkserver_pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(forkserver._forkserver_pid, signal.SIGKILL)
    forkserver._stop()  # closes its socket and reaps it
    _started_here = False


@contextlib.contextmanager
def own_start_method():
    """Inside: multiprocessing's default start method one of its own, so that a child can start.
    A child is told its parent's default method and sets it again as it starts; in a worker of
    Hydra's joblib launcher that is loky's, which a forkserver child does not know ("cannot find
    context for 'loky'"), so every finder with a memory cap in a joblib sweep failed."""
    method = multiprocessing.get_start_method(allow_none=True)
    if method is None or method in multiprocessing.get_all_start_methods():
        yield
        return
    multiprocessing.set_start_method(None, force=True)  # the platform's default again
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            multiprocessing.set_start_method(method, force=True)


@contextlib.contextmanager
def stopped_on_error():
    """The server stopped if what runs inside fails (the run will not search)."""
    try:
        yield
    except BaseException:
        stop()
        raise


@contextlib.contextmanager
def running(search: bool):
    """Inside: the server running where `search` (started now unless it was earlier, so that its
    imports overlap what this process does next); after: stopped, however it was started."""
    if search:
        start()
    try:
        yield
    finally:
        stop()


@contextlib.contextmanager
def _environ(**values: str):
    """Environment variables set for a process started inside."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
