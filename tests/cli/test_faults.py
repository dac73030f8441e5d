"""Faults that lost data or left a dead end (issue 55), each injected for real: bytes overwritten
in a checkpoint, a full disk (a small tmpfs, or a file-size cap where none can be mounted), a
read-only directory and an unwritable lock (read-only bind mounts), a record the checkpoint holds
cut short on disk, temporary files a killed write left, and a run that diverges."""

import contextlib
import json
import random
import re
import resource
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from bsexp.errors import DIVERGED
from bsexp.runs.sweep import point_dirname
from conftest import cli_env

# 32 steps of a small MLP (checkpoints of about 70 kB), a checkpoint and a record every 4 steps.
RUN = [
    "data=synthetic",
    "data.shape=[1,16]",
    "data.num_samples=600",
    "data.val_size=88",
    "model=mlp",
    "model.norm=none",
    "model.hidden=[256]",
    "batch.size=32",
    "epochs=2",
    "checkpoint.every_steps=4",
    "checkpoint.keep=100",
    "trainer.eval_every_steps=4",
    "trainer.threads=1",
    "logger=none",
    "trainer.progress=false",
]
TIMING = {"samples_per_s"}  # a record's figure of the machine, not of the run
# A summary's figures of the machine, not of the run.
MACHINE = {"wall_time_s", "train_time_s", "samples_per_s", "peak_memory_mb", "provenance", "resumed_from", "threads"}


def train(data_root, cwd, *args, **kwargs) -> subprocess.CompletedProcess:
    options = dict(cwd=cwd, env=cli_env(data_root), capture_output=True, text=True, timeout=300) | kwargs
    return subprocess.run([sys.executable, "-m", "bsexp.train", *args], **options)


@pytest.fixture(scope="module")
def whole(data_root, tmp_path_factory) -> Path:
    """The run, uninterrupted."""
    run_dir = tmp_path_factory.mktemp("whole") / "run"
    out = train(data_root, run_dir.parent, *RUN, f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def from_20(data_root, whole, tmp_path_factory) -> Path:
    """The run stopped at its checkpoint of step 20 and resumed from it."""
    run_dir = stopped_at(whole, tmp_path_factory.mktemp("from_20") / "run", 20)
    out = train(data_root, run_dir.parent, "resume=auto", f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    return run_dir


def stopped_at(whole: Path, to: Path, step: int) -> Path:
    """The run as a kill just after its checkpoint of `step` left it: no later checkpoint, no
    summary, the records up to that step."""
    shutil.copytree(whole, to)
    for path in (to / "checkpoints").glob("step-*.pt"):
        if int(path.stem.split("-")[1]) > step:
            path.unlink()
    (to / "summary.json").unlink()
    lines = (to / "metrics.jsonl").read_text().splitlines(keepends=True)
    (to / "metrics.jsonl").write_text("".join(line for line in lines if json.loads(line)["step"] <= step))
    return to


def records(run_dir: Path) -> list[dict]:
    return [
        {k: v for k, v in json.loads(line).items() if k not in TIMING}
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]


def last_state(run_dir: Path) -> dict:
    return torch.load(sorted((run_dir / "checkpoints").glob("step-*.pt"))[-1], weights_only=False)


def assert_same_end(a: Path, b: Path) -> None:
    """Two runs that ended with the same parameters and optimizer state, bit for bit, and the same
    records."""
    one, two = last_state(a), last_state(b)
    assert one["step"] == two["step"]
    for key, value in one["model"].items():
        assert torch.equal(value, two["model"][key]), key
    for key, value in one["optimizer"]["state"].items():
        for name, tensor in value.items():
            assert torch.equal(tensor, two["optimizer"]["state"][key][name]), (key, name)
    assert records(a) == records(b)


def files(run_dir: Path) -> dict[Path, tuple[bytes, int]]:
    """Every file and folder of a run: its bytes (files) and its modification time."""
    return {
        p.relative_to(run_dir): (p.read_bytes() if p.is_file() else b"", p.stat().st_mtime_ns)
        for p in [run_dir, *run_dir.rglob("*")]
    }


# ---------------------------------------------------------------------------------- mounts


@contextlib.contextmanager
def mounted(*args: str):
    """`mount ARGS` for the block, unmounted after; the test is skipped where it cannot mount
    (not root, no mount namespace of its own, no mount command)."""
    target = args[-1]
    try:
        done = subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)
    except OSError as exc:
        pytest.skip(f"cannot mount here ({exc})")
    if done.returncode:
        pytest.skip(f"cannot mount here: {done.stderr.strip()}")
    try:
        yield Path(target)
    finally:
        subprocess.run(["umount", "-l", target], capture_output=True, timeout=30)


@contextlib.contextmanager
def read_only(path: Path):
    """`path` (a directory or a file) read-only for the block: a read-only bind mount over it."""
    with mounted("--bind", str(path), str(path)):
        done = subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], capture_output=True, text=True)
        if done.returncode:
            pytest.skip(f"cannot remount read-only here: {done.stderr.strip()}")
        yield path


# ---------------------------------------------------------------------------------- item 1: digests


def largest_tensor(path: Path) -> tuple[int, int]:
    """(where its bytes start in the file, how many) for the largest tensor of a checkpoint: bytes
    that torch.load reads back as they are, whatever they hold."""
    with zipfile.ZipFile(path) as archive:
        info = max(archive.infolist(), key=lambda i: i.file_size)
    with open(path, "rb") as file:
        file.seek(info.header_offset + 26)  # a local file header: the lengths of its name and extra field
        name, extra = int.from_bytes(file.read(2), "little"), int.from_bytes(file.read(2), "little")
    return info.header_offset + 30 + name + extra, info.file_size


@pytest.mark.parametrize("damage", ["8 zeroed bytes", "4 KB of random bytes"])
def test_a_checkpoint_whose_bytes_changed_is_skipped_for_the_one_before(data_root, tmp_path, whole, from_20, damage):
    # Such damage used to load silently: a run resumed from altered parameters (or one reported
    # diverged that never was) while the good checkpoint before sat unused.
    run_dir = stopped_at(whole, tmp_path / "run", 24)
    newest = run_dir / "checkpoints" / "step-000000024.pt"
    start, size = largest_tensor(newest)
    data = bytearray(newest.read_bytes())
    if damage == "8 zeroed bytes":
        data[start + size // 2 : start + size // 2 + 8] = bytes(8)
    else:
        data[start : start + 4096] = random.Random(0).randbytes(4096)
    newest.write_bytes(bytes(data))
    out = train(data_root, tmp_path, "resume=auto", f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from"].endswith("step-000000020.pt")
    assert_same_end(run_dir, from_20)  # as the run resumed from the checkpoint before
    assert_same_end(run_dir, whole)  # and so as the run uninterrupted
    [warning] = [line for line in out.stdout.splitlines() if "step-000000024.pt" in line]
    assert warning == (
        f"checkpoint {newest} is corrupt (its bytes differ from those written (the SHA-256 digest written with it "
        f"does not match)); trying the one before it"
    )


def test_a_run_whose_every_checkpoint_changed_is_refused_and_left_as_it_was(data_root, tmp_path, whole):
    run_dir = stopped_at(whole, tmp_path / "run", 8)
    for path in (run_dir / "checkpoints").glob("step-*.pt"):
        start, _ = largest_tensor(path)
        data = bytearray(path.read_bytes())
        data[start : start + 8] = bytes(8)
        path.write_bytes(bytes(data))
    before = files(run_dir)
    out = train(data_root, tmp_path, "resume=auto", f"hydra.run.dir={run_dir}")
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("error: resume=auto: none of the 2 checkpoints in") and "move them aside" in line
    assert out.stdout.count("is corrupt (its bytes differ from those written") == 2
    assert files(run_dir) == before  # no .hydra/resume-1/, no line in train.log


# ---------------------------------------------------------------------------------- item 2: a full disk


def fsize_cap(limit: int):
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return cap


@pytest.mark.parametrize("how", ["a full tmpfs", "a file-size cap"])
def test_a_full_disk_is_one_line_a_failed_summary_and_no_temporary_file(data_root, tmp_path, whole, how):
    # It used to be 103 lines (three chained tracebacks), no summary.json (its own write failed),
    # and a cut-short temporary checkpoint and an empty temporary summary left on the full disk.
    # A tmpfs is a real full disk; where none can be mounted (not root), a file-size cap (each
    # process's RLIMIT_FSIZE, 50 kB: a checkpoint is 70) fails the same writes with EFBIG.
    per_step = [
        *(a for a in RUN if not a.startswith("checkpoint.")),
        "checkpoint.every_steps=1",
        "checkpoint.keep=1000",
    ]
    if how == "a full tmpfs":
        (tmp_path / "disk").mkdir()
        context, extra, words = (
            mounted("-t", "tmpfs", "-o", "size=600k", "tmpfs", str(tmp_path / "disk")),
            {},
            "the disk is full",
        )
    else:
        context, extra, words = (
            contextlib.nullcontext(tmp_path / "disk"),
            {"preexec_fn": fsize_cap(50_000)},
            "a file-size limit is reached",
        )
    with context as disk:
        run_dir = disk / "run"
        out = train(data_root, tmp_path, *per_step, f"hydra.run.dir={run_dir}", **extra)
        assert out.returncode == 1, out.stderr[-3000:]
        assert not [p for p in run_dir.rglob("*") if p.name.endswith(".tmp")]  # no temporary file left
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "failed"
        [line] = out.stderr.strip().splitlines()
        found = re.fullmatch(
            rf"error: {words}: writing {run_dir}/checkpoints/step-(\d+)\.pt needs ([\d.]+) MB(, [\d.]+ (MB|bytes) "
            rf"free there)? \((No space left on device|File too large)\); what was saved is in {run_dir}: make room, "
            rf"then continue with python -m bsexp.train resume=auto hydra.run.dir={run_dir}",
            line,
        )
        assert found, line
        checkpoint_mb = (whole / "checkpoints" / "step-000000004.pt").stat().st_size / 2**20
        assert float(found[2]) == pytest.approx(checkpoint_mb, abs=0.01)  # the space it needs: a checkpoint
        assert summary["error"] == f"DiskFull: {line[len('error: ') : line.index('; what')]}"
        assert summary["steps"] == int(found[1])
        saved = sorted((run_dir / "checkpoints").glob("step-*.pt"))
        assert len(saved) == int(found[1]) - 1  # every checkpoint before it, whole
        if how == "a full tmpfs":
            assert len(saved) > 2  # the disk filled mid-run


@pytest.mark.slow  # 40-60 s on 2 cores: two sweeps of three points
def test_a_sweep_on_a_full_disk_names_every_failed_point_and_continues_once_there_is_room(data_root, tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    sweep_args = ["-m", "seed=0,1,2", *(a for a in RUN if not a.startswith("checkpoint.keep")), "checkpoint.keep=2"]
    with mounted("-t", "tmpfs", "-o", "size=400k", "tmpfs", str(disk)):
        sweep = disk / "sweep"
        out = train(data_root, tmp_path, *sweep_args, f"hydra.sweep.dir={sweep}")
        assert out.returncode == 1, out.stderr[-3000:]
        last = out.stderr.strip().splitlines()[-1]
        assert last.startswith("error: the disk is full: writing ") and " needs " in last
        assert last.endswith(
            f"ran: 3 points (1 completed, 2 failed: 1, 2); each point's outcome is in {sweep / 'jobs.jsonl'}"
        )
        assert not [p for p in sweep.rglob("*") if p.name.endswith(".tmp")]
        subprocess.run(["mount", "-o", "remount,size=20m", str(disk)], check=True)  # room made
        out = train(data_root, tmp_path, "-m", "resume=auto", f"hydra.sweep.dir={sweep}")
        assert out.returncode == 0, out.stderr[-3000:]
        assert {json.loads(p.read_text())["status"] for p in sweep.glob("*/summary.json")} == {"completed"}
        assert len(list(sweep.glob("*/summary.json"))) == 3


# ---------------------------------------------------------------------------------- item 3: a sweep point left empty


def test_a_point_a_full_disk_left_without_a_config_is_started_afresh_by_the_continue_command(data_root, tmp_path):
    # A full disk left the next point's .hydra/config.yaml empty; the continue command then refused
    # the whole sweep ("holds no mapping") until that directory was deleted by hand.
    sweep = tmp_path / "sweep"
    small = [a for a in RUN if not a.startswith(("epochs", "checkpoint.", "trainer.eval"))]
    out = train(data_root, tmp_path, "-m", "seed=0", *small, "epochs=1", f"hydra.sweep.dir={sweep}")
    assert out.returncode == 0, out.stderr[-3000:]
    [point] = [d for d in sweep.iterdir() if d.is_dir()]
    expected = {k: v for k, v in json.loads((point / "summary.json").read_text()).items() if k not in MACHINE}
    # What Hydra left as the disk filled: the directory, an empty log, empty config files.
    shutil.rmtree(point)
    (point / ".hydra").mkdir(parents=True)
    for name in (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml", "train.log"):
        (point / name).write_text("")
    index = sweep / "jobs.jsonl"
    index.write_text("".join(line + "\n" for line in index.read_text().splitlines() if point.name not in line))
    out = train(data_root, tmp_path, "-m", "resume=auto", f"hydra.sweep.dir={sweep}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((point / "summary.json").read_text())
    assert {k: v for k, v in summary.items() if k not in MACHINE} == expected  # as the point ran the first time
    assert (point / ".hydra" / "config.yaml").read_text() and not (point / ".hydra" / "continued-1").exists()


def test_a_sweep_stopped_by_a_point_that_could_not_start_names_it_as_failed(data_root, tmp_path):
    # A point whose own .hydra/ Hydra cannot write (a full disk; here a file where its folder
    # goes) stops the sweep before the point can be recorded in jobs.jsonl: the last line used to
    # name only the points recorded, as if that one had never been.
    sweep = tmp_path / "sweep"
    small = [a for a in RUN if not a.startswith(("epochs", "checkpoint.", "trainer.eval"))]
    args = ["-m", "seed=0,1,2", *small, "epochs=1", f"hydra.sweep.dir={sweep}"]
    blocked = sweep / point_dirname(1, ["seed=1", *small, "epochs=1"])
    blocked.mkdir(parents=True)
    (blocked / ".hydra").write_text("")
    out = train(data_root, tmp_path, *args)
    assert out.returncode == 1, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: a sweep point failed ([Errno 17] File exists: ")
    assert last.endswith(
        f"ran: 2 points (1 completed, 1 failed: 1); 1 not run: 2; each point's outcome is in {sweep / 'jobs.jsonl'}"
    )


# ---------------------------------------------------------------------------------- item 4: pre-flight


def test_a_resume_on_a_read_only_directory_says_so_in_one_line(data_root, tmp_path, whole):
    # It used to be a Hydra warning, then a 57-line traceback and exit code 1, even for a run
    # that completed, which the docs promise "says so ... and exits 0".
    run_dir = tmp_path / "run"
    shutil.copytree(whole, run_dir)
    before = files(run_dir)
    with read_only(run_dir):
        out = train(data_root, tmp_path, "resume=auto", f"hydra.run.dir={run_dir}")
        assert out.returncode == 0, out.stderr[-3000:]
        assert f"{run_dir} completed at step 32 (summary.json): nothing left to resume" in out.stdout
        assert "Traceback" not in out.stderr and "warn" not in out.stderr.lower()
    assert files(run_dir) == before
    (run_dir / "summary.json").unlink()  # killed after its last checkpoint: a resume would write
    before = files(run_dir)
    with read_only(run_dir):
        out = train(data_root, tmp_path, "resume=auto", f"hydra.run.dir={run_dir}")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"error: hydra.run.dir={run_dir}: is not writable (a read-only file system): the run writes its "
        f"checkpoints, metrics and summary there"
    ]
    assert files(run_dir) == before


@pytest.mark.parametrize("how", ["a read-only lock file", "a folder in its place"])
def test_a_lock_that_cannot_be_taken_refuses_the_run(data_root, tmp_path, whole, how):
    # When the lock file could not be opened, the error became a Hydra warning and the run went
    # on unlocked: two resumes of one directory both ran.
    run_dir = stopped_at(whole, tmp_path / "run", 24)
    lock = run_dir / ".bsexp.lock"
    if how == "a folder in its place":
        lock.unlink()
        lock.mkdir()
        context, why = contextlib.nullcontext(lock), "Is a directory"
    else:
        context, why = read_only(lock), "Read-only file system"
    before = files(run_dir)
    with context:
        out = train(data_root, tmp_path, "resume=auto", f"hydra.run.dir={run_dir}")
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.strip().splitlines() == [
        f"error: hydra.run.dir={run_dir}: cannot be locked for this run: its lock file .bsexp.lock cannot be "
        f"opened ({why})"
    ]
    assert files(run_dir) == before


# ---------------------------------------------------------------------------------- items 5 and 6: on resume


def test_a_record_the_checkpoint_holds_cut_short_on_disk_is_written_back(data_root, tmp_path, whole):
    # metrics.jsonl was only flushed, so a power loss could leave it behind the newest checkpoint;
    # the resume kept the cut line, added a newline and went on: one record unreadable mid-file.
    run_dir = stopped_at(whole, tmp_path / "run", 24)
    metrics = run_dir / "metrics.jsonl"
    text = metrics.read_text()
    metrics.write_text(text[: text.rindex("{") + 40])  # the checkpoint's last record (step 24), cut short
    out = train(data_root, tmp_path, "resume=auto", f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    # Those the checkpoint holds as they were first written, then every record readable, none
    # missing, none twice.
    lines = metrics.read_text().splitlines(keepends=True)
    assert lines[:6] == (whole / "metrics.jsonl").read_text().splitlines(keepends=True)[:6]
    assert records(run_dir) == records(whole)
    assert f"{metrics} lacked or held cut short 1 of the 6 records its checkpoint holds: written back" in out.stdout


def test_temporary_files_a_killed_write_left_are_removed_when_the_run_resumes(data_root, tmp_path, whole):
    # Each as large as a checkpoint, they were kept through later resumes and completions.
    run_dir = stopped_at(whole, tmp_path / "run", 24)
    left = [run_dir / "checkpoints" / ".step-000000028.pt.4242.tmp", run_dir / ".summary.json.4242.tmp"]
    for path in left:
        path.write_bytes(b"cut short")
    keep = run_dir / "checkpoints" / ".notes.tmp"  # not a name bsexp writes: the user's
    keep.write_text("mine")
    out = train(data_root, tmp_path, "resume=auto", f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert not any(path.exists() for path in left) and keep.read_text() == "mine"
    assert [p for p in run_dir.rglob(".*.tmp")] == [keep]
    assert f"removed 2 temporary file(s) that writes into {run_dir} left unfinished" in out.stdout


# ---------------------------------------------------------------------------------- item 7: left as it was


def test_resuming_a_completed_run_leaves_every_file_of_it_as_it_was(data_root, tmp_path, whole):
    # It said "nothing rewritten", yet wrote .hydra/resume-1/ and lines into train.log.
    run_dir = tmp_path / "run"
    shutil.copytree(whole, run_dir)
    before = files(run_dir)
    out = train(data_root, tmp_path, "resume=auto", f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "completed at step 32 (summary.json): nothing left to resume, nothing rewritten" in out.stdout
    assert files(run_dir) == before  # byte for byte, and not a modification time moved


# ---------------------------------------------------------------------------------- item 8: divergence


def test_a_sweep_with_a_diverged_point_says_so_and_exits_with_the_divergence_code(data_root, tmp_path):
    sweep = tmp_path / "sweep"
    small = [a for a in RUN if not a.startswith(("epochs", "checkpoint.", "trainer.eval"))]
    diverges = ["optimizer.lr=0.1,1e6", "schedule.warmup_shape=none", "epochs=1"]
    out = train(data_root, tmp_path, "-m", *diverges, *small, f"hydra.sweep.dir={sweep}")
    assert out.returncode == DIVERGED, out.stderr[-3000:]
    assert out.stderr.strip().splitlines()[-1] == (
        f"diverged: sweep point 1; ran: 2 points (1 completed, 1 diverged: 1); each point's outcome is in "
        f"{sweep / 'jobs.jsonl'}"
    )
    statuses = {json.loads(p.read_text())["status"] for p in sweep.glob("*/summary.json")}
    assert statuses == {"completed", "diverged"}


def test_the_exit_codes_are_documented():
    outputs = (Path(__file__).resolve().parents[2] / "docs" / "outputs.md").read_text()
    table = outputs[outputs.index("## Exit codes") :]
    for code in ("| 0 |", "| 1 |", "| 2 |", f"| {DIVERGED} |", "| 128 + n |", "| 130 |"):
        assert code in table, code
