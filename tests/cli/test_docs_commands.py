"""Every `python -m bsexp.train` command shown in README.md, docs/ and the generated configuration
reference composes: run as written (with `--cfg job`, so nothing trains) from a scratch directory,
through the CLI's own entry point, it exits 0 — or 2 where its comment says `exits 2`, a
documented error. The command lines run in one process (Python and Hydra start once: about 0.05 s
a line, against 0.3 s in a process each), and any that fails is run again in a fresh process
before it counts. A resume is run for real, in a process of its own, against a small finished
run. How a command is read (sweeps, torchrun, placeholders, variables, resumes, set-up lines):
scripts/docs_commands.py."""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
from collections import Counter

import pytest

from conftest import ROOT, cli_env


def _reader():
    spec = importlib.util.spec_from_file_location("docs_commands", ROOT / "scripts" / "docs_commands.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_commands"] = module
    spec.loader.exec_module(module)
    return module


docs = _reader()
COMMANDS = [command for name, markdown in docs.documents() for command in docs.extract(name, markdown)]
POLICY_PAGES = ("fixed", "accumulation", "finder", "scheduled", "adaptive", "branch")


def test_the_readme_and_every_policy_page_show_commands_that_are_checked():
    """The reader finds what the pages show (a reader that found nothing would pass everything)."""
    found = Counter(command.where.split(":")[0] for command in COMMANDS)
    assert found["README.md"] >= 10, found
    for page in POLICY_PAGES:
        assert found[f"docs/policies/{page}.md"] >= 2, (page, found)
    assert found["reference/config.md (generated)"] >= 1, found
    assert sum(c.multirun for c in COMMANDS) >= 10 and sum(c.torchrun for c in COMMANDS) >= 3
    assert sum(c.resumes for c in COMMANDS) >= 3 and sum(c.expect_exit == 2 for c in COMMANDS) >= 2


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, data_root):
    """A real run, small, with checkpoints: what a documented resume continues (one that adds epochs
    trains them: the run is small so that it takes seconds)."""
    run_dir = tmp_path_factory.mktemp("docs") / "run"
    tiny = [
        "data=synthetic",
        "data.shape=[1,16]",
        "data.num_samples=600",
        "data.val_size=88",
        "model=mlp",
        "model.hidden=[32]",
        "epochs=1",
        "logger=none",
        "trainer.progress=false",
        "checkpoint.every_steps=2",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "bsexp.train", *tiny, f"hydra.run.dir={run_dir}"],
        cwd=run_dir.parent,
        env=cli_env(data_root),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    checkpoint = sorted((run_dir / "checkpoints").glob("step-*.pt"))[-1]
    return str(run_dir), str(checkpoint)


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory, data_root):
    """A real sweep, small and finished: what a documented `-m resume=auto` continues (each point
    then says it has nothing left to do)."""
    sweep = tmp_path_factory.mktemp("docs") / "sweep"
    tiny = [
        "data=synthetic",
        "data.shape=[1,16]",
        "data.num_samples=600",
        "data.val_size=88",
        "model=mlp",
        "model.hidden=[32]",
        "epochs=1",
        "logger=none",
        "trainer.progress=false",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "bsexp.train", "-m", "batch.size=32,64", *tiny, f"hydra.sweep.dir={sweep}"],
        cwd=sweep.parent,
        env=cli_env(data_root),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return str(sweep)


@pytest.fixture(scope="module")
def composed(tmp_path_factory, data_root):
    """Every command line that composes (all but the resumes), run in one process through the CLI's
    own entry point (`scripts/docs_commands.py --compose`): {(where, args): (exit code, stderr)}.
    Each command runs in a scratch directory of its own, after its block's set-up lines."""
    jobs, keys = [], []
    for command in COMMANDS:
        if command.resumes:
            continue
        scratch = tmp_path_factory.mktemp("cmd")
        for line in command.setup:  # the config files the command reads, written as the page says
            subprocess.run(["bash", "-c", line], cwd=scratch, check=True, timeout=30)
        for args in docs.command_lines(command, cwd=str(scratch)):
            jobs.append({"cwd": str(scratch), "args": args})
            keys.append((command.where, tuple(args)))
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "docs_commands.py"), "--compose"],
        input=json.dumps(jobs),
        env=cli_env(data_root),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    return {key: (job, result) for key, job, result in zip(keys, jobs, results)}


def fresh(args: list[str], cwd: str, data_root) -> tuple[int, str]:
    """`python -m bsexp.train ARGS` in a process of its own, as a user runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "bsexp.train", *args],
        cwd=cwd,
        env=cli_env(data_root),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stderr


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_a_documented_command_composes(command, request, data_root, tmp_path):
    if command.resumes:  # run for real, in a process of its own, against a finished run
        run_dir, checkpoint = request.getfixturevalue("finished_run")
        sweep = request.getfixturevalue("finished_sweep") if command.multirun else None
        lines = docs.command_lines(command, run_dir, checkpoint, sweep_dir=sweep)
        checks = [(args, *fresh(args, str(tmp_path), data_root)) for args in lines]
    else:
        results = request.getfixturevalue("composed")
        checks = []
        for key, (job, result) in results.items():
            if key[0] != command.where:
                continue
            code, stderr = result["code"], result["stderr"]
            if code != command.expect_exit:  # confirmed in a fresh process before it counts
                code, stderr = fresh(job["args"], job["cwd"], data_root)
            checks.append((job["args"], code, stderr))
    assert checks, f"{command.where}: no command line was checked"
    for args, code, stderr in checks:
        assert code == command.expect_exit, (
            f"{command.where}: {command.text}\n  checked as: python -m bsexp.train {shlex.join(args)}\n"
            f"  exit {code} (expected {command.expect_exit}): {stderr.strip()[-1500:]}"
        )
        if command.expect_exit == 2:  # a documented error is one line, not a traceback
            last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
            assert "Traceback" not in stderr and last.startswith("error:"), stderr
