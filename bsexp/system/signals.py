"""Signals that stop a run cleanly: it saves a checkpoint at the next step boundary, then stops."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading


@contextlib.contextmanager
def stop_on_signals(watch):
    """SIGTERM (a scheduler's preemption, torchrun's shutdown), SIGUSR1 (SLURM's warning before
    the time limit) and SIGINT (Ctrl-C) ask the loop to save a checkpoint at the next step
    boundary and stop: they set `watch.stop_signal` (bsexp.train.loop.Watch, or any holder of that
    attribute). A second Ctrl-C stops at once (KeyboardInterrupt), without a checkpoint."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    wanted = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
    previous = {s: signal.getsignal(s) for s in wanted}

    def ask_to_stop(signum, frame):
        if signum == signal.SIGINT:
            if watch.stop_signal == signal.SIGINT:
                raise KeyboardInterrupt
            if os.environ.get("RANK", "0") == "0":  # once, not from every rank
                print(
                    "\nCtrl-C: saving a checkpoint at the next step, then stopping (Ctrl-C again to stop at once)",
                    file=sys.stderr,
                    flush=True,
                )
        watch.stop_signal = signum

    for s in wanted:
        signal.signal(s, ask_to_stop)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        # A handler that was there before (submitit's, which requeues a SLURM job on SIGUSR1)
        # still gets the signal, once the checkpoint is saved: the requeued job resumes from it.
        chained = previous.get(watch.stop_signal)
        if watch.stop_signal and callable(chained) and chained is not signal.default_int_handler:
            chained(watch.stop_signal, None)
