from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from bsexp.config import register_configs

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"

register_configs()


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    """One data cache for the whole session (MNIST-1D is generated once per size)."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture
def make_cfg(data_root, monkeypatch):
    """Compose the real config from conf/ with overrides, as the CLI would."""
    monkeypatch.setenv("BSEXP_DATA", str(data_root))

    def make(*overrides: str):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose("config", overrides=["logger=none", *overrides])

    return make


def cli_env(data_root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(BSEXP_DATA=str(data_root), WANDB_SILENT="true", WANDB_DISABLE_GIT="true",
               PYTHONPATH=str(Path(__file__).parent))  # tests/user_models.py
    for name in ("HYDRA_FULL_ERROR", "WANDB_MODE", "WANDB_API_KEY"):  # bsexp's own defaults, offline W&B
        env.pop(name, None)
    return env


@pytest.fixture
def run_cli(data_root, tmp_path):
    """Run `python -m bsexp.train ARGS` in a subprocess from a scratch working directory."""

    def run(*args: str, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
        options = dict(capture_output=True, text=True) | kwargs
        return subprocess.run([sys.executable, "-m", "bsexp.train", *args], cwd=tmp_path,
                              env=cli_env(data_root), timeout=timeout, **options)

    return run
