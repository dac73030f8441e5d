"""How SyncBatchNorm moves the DDP estimate of the gradient noise scale.

Under DDP bsexp measures B_simple from each rank's gradient before the all-reduce (B_small = the
rank's batch) against the all-reduced one (B_big = the global batch). With SyncBatchNorm a rank's
gradient is not the gradient of its own samples alone: the statistics are shared, so it carries
terms from the other ranks' samples, and the "small" gradient is not an independent half.

This trains two ranks (gloo, CPU) at an LR so small that the parameters stay where they started,
so every step measures the noise at the same point, with SyncBatchNorm on and off, and prints
B_simple (the mean over the steps of the two unbiased estimates, divided) for each.

    python scripts/measure_syncbn_noise.py                  # cnn1d (BatchNorm), MNIST-1D, batch 128
    python scripts/measure_syncbn_noise.py --steps 200 batch.size=256
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bsexp.config.schema import register_configs  # noqa: E402
from bsexp.runs.sweep import register_resolvers  # noqa: E402


def worker(cfg):
    from bsexp.engine.distributed import close_world, init_world
    from bsexp.train.loop import TrainState, build_loop, train

    torch.set_num_threads(1)
    world = init_world("cpu", "gloo", 120)
    try:
        loop = build_loop(cfg, world)
        train(loop, TrainState())
        return loop.step.noise.scale.summary()
    finally:
        close_world(world)


def measure(overrides: list[str], sync: bool) -> dict:
    register_configs()
    register_resolvers()
    with initialize_config_dir(config_dir=str(ROOT / "bsexp" / "conf"), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "logger=none",
                "trainer.progress=false",
                "distributed=ddp",
                "distributed.nproc_per_node=2",
                f"distributed.sync_batchnorm={sync}",
                "optimizer.lr=1e-9",
                "optimizer.weight_decay=0",
                "optimizer.momentum=0",
                "schedule.warmup_shape=none",
                "schedule.main=constant",
                "trainer.oom_recovery=false",
                *overrides,
            ],
        )
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=2,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.2,
    )
    return elastic_launch(config, worker)(cfg)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    args, overrides = parser.parse_known_args()
    os.environ.setdefault("BSEXP_DATA", str(ROOT / "data"))
    overrides = ["batch.size=128", "epochs=100", f"trainer.max_steps={args.steps}", *overrides]
    print(f"2 ranks, {args.steps} steps at the initial parameters; overrides: {' '.join(overrides)}")
    found = {sync: measure(overrides, sync) for sync in (False, True)}
    for sync, summary in found.items():
        print(
            f"  sync_batchnorm={str(sync).lower():<5}  B_simple = {summary['noise_b_simple_mean']:8.1f}   "
            f"|G|^2 = {summary['noise_grad_sq_mean']:.4g}   tr(Sigma) = {summary['noise_trace_sigma_mean']:.4g}   "
            f"({summary['noise_measurements']} measurements)"
        )
    ratio = found[True]["noise_b_simple_mean"] / found[False]["noise_b_simple_mean"]
    print(f"  SyncBatchNorm moves B_simple by x {ratio:.3f}")


if __name__ == "__main__":
    main()
