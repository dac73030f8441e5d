"""A plain (not editable) install carries everything a run needs: the config ships inside the
package, so `python -m bsexp.train` runs from any directory."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

from conftest import ROOT, TINY_RUN, cli_env


@pytest.mark.slow  # 17-32 s on 2 cores: scripts/test_slow.sh (the default tiers' time)
def test_a_plain_install_runs_from_another_directory(data_root, tmp_path):
    # A fresh virtual environment that sees the test environment's dependencies (torch and the
    # rest, through a .pth line) but not its editable bsexp, which is installed anew, not editable.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    new_site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    deps = sysconfig.get_paths()["purelib"]
    with open(os.path.join(new_site, "test_deps.pth"), "w") as pth:
        pth.write(deps + "\n")  # a path line: its own .pth files (the editable bsexp's hook) are not read
    env = {k: v for k, v in cli_env(data_root).items() if k != "PYTHONPATH"}
    source = tmp_path / "source"  # a copy: the build writes build/ and *.egg-info beside the sources
    shutil.copytree(ROOT / "bsexp", source / "bsexp", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    out = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", str(source)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run(
        [str(python), "-c", "import bsexp, bsexp.conf; print(bsexp.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=elsewhere,
        timeout=120,
    )
    assert where.stdout.strip().startswith(new_site), (where.stdout, where.stderr)  # the installed copy
    run = subprocess.run(
        [
            str(python),
            "-m",
            "bsexp.train",
            *TINY_RUN,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=elsewhere,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    [summary] = elsewhere.glob("outputs/*/*/summary.json")
    assert json.loads(summary.read_text())["status"] == "completed"
