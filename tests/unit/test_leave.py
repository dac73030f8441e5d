"""bsexp.system.leave: a single run's process ends as sys.exit would (threads joined, exit
handlers run, the exit code and message), less the interpreter's teardown."""

import subprocess
import sys

import pytest

SCRIPT = """
import atexit, sys, threading, time
from pathlib import Path
from bsexp.system.leave import leave

out = Path(sys.argv[1])

class Torn:  # what the interpreter's teardown would finalise: a module-level object
    def __del__(self):
        (out / "torn_down").write_text("yes")

kept = Torn()
atexit.register(lambda: (out / "exit_handler").write_text("ran"))
def late():
    time.sleep(0.3)
    (out / "thread").write_text("joined")
threading.Thread(target=late).start()  # not a daemon: the exit waits for it
import concurrent.futures
pool = concurrent.futures.ThreadPoolExecutor(1)  # idle workers that wait until told to stop (torch.compile keeps one)
pool.submit(lambda: None).result()
print("printed, not yet flushed", end="")
code = eval(sys.argv[3])
leave(code) if sys.argv[2] == "leave" else sys.exit(code)
"""


def end(tmp_path, how, code):
    out = tmp_path / f"{how}-{code}"
    out.mkdir()
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(out), how, code], capture_output=True, text=True, timeout=60
    )
    return run, {p.name: p.read_text() for p in out.iterdir()}


@pytest.mark.parametrize(("code", "status"), [("None", 0), ("0", 0), ("3", 3), ("'no room left'", 1)])
def test_leave_ends_as_sys_exit_does_but_for_the_teardown(tmp_path, code, status):
    left, left_files = end(tmp_path, "leave", code)
    exited, exited_files = end(tmp_path, "exit", code)
    assert left.returncode == exited.returncode == status
    assert left.stdout == exited.stdout == "printed, not yet flushed"
    assert left.stderr == exited.stderr == ("no room left\n" if status == 1 else "")
    # Both join the thread and run the exit handlers; only sys.exit tears the modules down.
    assert exited_files == {"exit_handler": "ran", "thread": "joined", "torn_down": "yes"}
    assert left_files == {"exit_handler": "ran", "thread": "joined"}


def test_leave_keeps_the_exit_code_where_stdout_is_gone(tmp_path):
    # A reader that stopped reading (`python -m bsexp.train ... | head -1`): the flush fails, the
    # exit code stays the run's.
    script = "import sys; from bsexp.system.leave import leave; print('x' * 100000); sys.stdout.close(); leave(3)"
    run = subprocess.run([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)
    assert run.returncode == 3 and b"Traceback" not in run.stderr, run.stderr
