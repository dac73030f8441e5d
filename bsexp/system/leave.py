"""How `python -m bsexp.train` ends a single run's process: as `sys.exit` would, less the teardown."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn


def leave(code: int | str | None) -> NoReturn:
    """End the process as `sys.exit(code)` would, less the interpreter's teardown: its threads
    joined (after threading's own exit calls) and its exit handlers run (logging's flush and close,
    W&B's, multiprocessing's children stopped), stdout and stderr flushed, then `os._exit`. The
    teardown frees every module's objects one by one; with torch and its compiler loaded that is
    0.45 s of the default run's 8 s on 2 CPU cores (`python -c "import torch; torch.optim.SGD(...)"`
    ends in 2.05 s, in 1.6 s without it), and it writes nothing of bsexp's: every file a run writes
    is closed before its job returns."""
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): the message on stderr, exit code 1
        print(code, file=sys.stderr)
        code = 1
    # Then as the interpreter ends: threading's own exit calls (an executor's idle workers told to
    # stop: torch.compile keeps a pool), every thread that is not a daemon joined, the exit handlers.
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone (`| head`), a stream closed
            stream.flush()
    os._exit(code)
