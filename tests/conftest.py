from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The default tiers test bsexp on the CPU: with a GPU visible, device=auto (the default) would
# train there, and a CPU memory cap would meet CUDA's address space. So CUDA is hidden from them
# and from every process they start; tests/gpu tests the GPU, with BSEXP_TEST_GPU=1 (README).
if os.environ.get("BSEXP_TEST_GPU") != "1":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
# Two test workers, each training in its own processes, put more OpenMP threads on the cores than
# there are cores (each test's runs see only each other: own_cores_registry). OpenMP's threads then
# spin while they wait for each other and training crawls: two runs of 2 threads on 2 cores took
# 89 s each, 6 s with waiting threads that sleep (OMP_WAIT_POLICY=PASSIVE; the same runs, same
# results: the policy moves no sum). Set before torch loads here and inherited by every process.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from hydra import compose, initialize_config_dir  # noqa: E402

from bsexp.config.schema import register_configs  # noqa: E402
from bsexp.runs.sweep import register_resolvers  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "bsexp" / "conf"
HELPERS = ROOT / "tests" / "helpers"

register_configs()
register_resolvers()


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    """One data cache for the whole session (MNIST-1D is generated once per size)."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture(autouse=True)
def own_cores_registry(tmp_path_factory, monkeypatch):
    """The runs of one test see each other in bsexp.system.cores' registry, not the runs of the tests
    beside it or of anyone else on the machine: a run's share of the cores, which moves its
    threads and so its rounding, depends on nothing outside the test (its processes inherit it)."""
    monkeypatch.setenv("BSEXP_CORES_REGISTRY", str(tmp_path_factory.mktemp("cores")))


@pytest.fixture
def make_cfg(data_root, monkeypatch):
    """Compose the real config from conf/ with overrides, as the CLI would."""
    monkeypatch.setenv("BSEXP_DATA", str(data_root))

    def make(*overrides: str):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose("config", overrides=["logger=none", *overrides])

    return make


# A run of a second or two through the CLI, for tests that need one to have happened
# (tests/helpers/tiny.py: a model for the equivalence tests).
TINY_RUN = [
    "data.num_samples=600",
    "data.val_size=100",
    "epochs=1",
    "model.width=8",
    "logger=none",
    "trainer.progress=false",
]


def cli_env(data_root: Path) -> dict[str, str]:
    env = dict(os.environ)
    # bsexp and tests/helpers (user_models.py) first, then what the caller's path holds (packages
    # installed into a folder of their own: scripts/gpu_check.sh).
    path = [str(ROOT), str(HELPERS), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env.update(
        BSEXP_DATA=str(data_root), WANDB_SILENT="true", WANDB_DISABLE_GIT="true", PYTHONPATH=os.pathsep.join(path)
    )
    for name in ("HYDRA_FULL_ERROR", "WANDB_MODE", "WANDB_API_KEY"):  # bsexp's own defaults, offline W&B
        env.pop(name, None)
    return env


@pytest.fixture
def run_cli(data_root, tmp_path):
    """Run `python -m bsexp.train ARGS` in a subprocess from a scratch working directory."""

    def run(*args: str, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
        options = dict(capture_output=True, text=True, env=cli_env(data_root)) | kwargs
        return subprocess.run([sys.executable, "-m", "bsexp.train", *args], cwd=tmp_path, timeout=timeout, **options)

    return run


def limit_for_size(data_root: Path, tmp: Path, overrides: list[str], size: float) -> float:
    """A memory limit (GB) under which the finder's largest fitting micro-batch is about `size`:
    measured with the finder under 1 GB, then moved by the measured memory per sample. Not
    guessed: the fixed memory of torch and the model differ between machines."""
    finder = [] if "batch=finder" in overrides else ["batch=finder"]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bsexp.train",
            *overrides,
            *finder,
            "logger=none",
            "batch.finder.margin=0",
            "batch.finder.data_fraction=null",
            "batch.finder.memory_limit_gb=1.0",
            "trainer.max_steps=1",
            f"hydra.run.dir={tmp / 'run'}",
        ],
        cwd=tmp,
        env=cli_env(data_root),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    finder = json.loads((tmp / "run" / "finder.json").read_text())
    # The finder's own line (bsexp.finder.result.peak_line: sizes far apart), not the two
    # largest passes, which a settled search leaves a few percent apart: there a few MB of noise
    # made the slope 0.17 MB a sample instead of 0.127, and the limit 0.58 GB instead of 0.69.
    return 1.0 + (size - finder["micro_size"]) * finder["per_sample_mb"] / 1024


def with_defaults(fn, schema_cls):
    """`fn` (a dataset builder or model) called with its schema's defaults for every option the
    caller leaves out: the builders take every key of their config node, and the defaults live
    in the schema alone."""
    import dataclasses
    import inspect

    defaults = {}
    for f in dataclasses.fields(schema_cls):
        if f.name == "_target_":
            continue
        value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if isinstance(value, str) and value.startswith("${"):  # an interpolation (data.root): the caller's
            continue
        defaults[f.name] = str(value) if hasattr(value, "value") else value  # enums as their names
    signature = inspect.signature(fn)

    def call(*args, **kwargs):
        given = signature.bind_partial(*args, **kwargs).arguments
        return fn(
            *args, **{k: v for k, v in defaults.items() if k not in given and k in signature.parameters}, **kwargs
        )

    return call


# tests/gpu's order: the tests that start the most processes (ResNet-18 runs, a run killed and
# resumed) first, so that the workers sharing the GPU do not end on one long test left for last
# (scripts/gpu_check.sh gives them a few minutes in all).
GPU_HEAVY_FIRST = (
    "test_the_fast_path_is_cudas_default",  # three ResNet-18 runs, one compiled
    "test_the_finder_finds_at_least",  # the finder, then two runs under its cap
    "test_a_real_cuda_oom_mid_run",  # two ResNet-18 runs
    "test_accumulation_equals_one_large_batch",  # two runs, on each of three paths
    "test_a_run_killed_mid_way",  # a whole run, then one killed and resumed
    "test_torchrun_with_one_process",
)


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        if "tests/gpu/" not in item.nodeid:
            return 0
        return next((n for n, p in enumerate(GPU_HEAVY_FIRST) if item.name.startswith(p)), len(GPU_HEAVY_FIRST))

    items.sort(key=rank)  # stable: everything else keeps its order
