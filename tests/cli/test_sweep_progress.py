"""A sweep's progress as a whole (bsexp.runs.sweep_progress), through the CLI: on a terminal (a real
pseudo-terminal, python's pty) a line after each point, the points done of the grid and the time
left; nothing of it in a pipe. Its points one after another in one process (Hydra's basic
launcher), or side by side in joblib's processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import cli_env

# A point of a second or so: synthetic data, a small MLP, one epoch.
TINY = [
    "data=synthetic",
    "data.shape=[1,16]",
    "data.num_samples=600",
    "data.val_size=88",
    "model=mlp",
    "model.hidden=[32]",
    "epochs=1",
    "logger=none",
]


def on_a_terminal(args: list[str], cwd, env) -> tuple[int, str]:
    """`python -m bsexp.train ARGS` with a pseudo-terminal for its stdin, stdout and stderr: its exit
    code and all it wrote there, read as it runs (a terminal's buffer is small)."""
    import pty

    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "bsexp.train", *args], cwd=cwd, env=env, stdin=follower, stdout=follower, stderr=follower
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the last holder of the terminal's other end has gone
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return process.wait(timeout=600), b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


def progress(text: str) -> list[str]:
    return re.findall(r"^sweep: \d+/\d+ points done.*$", text, flags=re.MULTILINE)


def test_a_sweep_on_a_terminal_says_after_each_point_how_many_are_done_and_the_time_left(data_root, tmp_path):
    sweep = tmp_path / "sweep"
    code, terminal = on_a_terminal(
        ["-m", *TINY, "seed=0,1,2", f"hydra.sweep.dir={sweep}"], tmp_path, cli_env(data_root)
    )
    assert code == 0, terminal[-3000:]
    lines = progress(terminal)
    assert [line.split(" points done")[0] for line in lines] == ["sweep: 1/3", "sweep: 2/3", "sweep: 3/3"], terminal
    assert re.fullmatch(r"sweep: 1/3 points done, about \d+ (s|min) left", lines[0]), lines
    assert re.fullmatch(r"sweep: 3/3 points done in \d+ (s|min)", lines[2]), lines
    # Told after the point's own summary, before the next point starts.
    assert terminal.index(lines[0]) > terminal.index("outputs") and terminal.count("  status ") == 3


def test_a_piped_sweep_prints_no_progress(data_root, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "bsexp.train", "-m", *TINY, "seed=0,1", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        cwd=tmp_path,
        env=cli_env(data_root),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("  status ") == 2 and "points done" not in done.stdout + done.stderr


@pytest.mark.slow  # joblib's processes start in 20-60 s on 2 cores: scripts/test_slow.sh runs it
def test_a_sweep_run_side_by_side_tells_its_progress_from_the_parent_process(data_root, tmp_path):
    """With hydra/launcher=joblib the points run in joblib's processes; the process that started the
    sweep watches its index and tells each point that ends, once."""
    sweep = tmp_path / "sweep"
    args = ["-m", *TINY, "seed=0,1,2", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}"]
    code, terminal = on_a_terminal(args, tmp_path, cli_env(data_root))
    assert code == 0, terminal[-3000:]
    lines = progress(terminal)
    # Side by side points can end between two of the parent's looks: a count may be skipped (1/3
    # then 3/3, once in CI; all three in one look, once more), never repeated or gone back, and the
    # last is the whole grid, told with the time it took; every line before it, the time left.
    done = [int(re.match(r"sweep: (\d+)/3", line)[1]) for line in lines]
    assert done == sorted(set(done)) and done[-1] == 3, terminal
    assert all("left" in line for line in lines[:-1]) and " in " in lines[-1], lines
