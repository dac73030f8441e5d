"""What measuring the gradient noise scale costs per training step (trainer.noise_scale).

Two loops are built from the same Hydra config, one with `trainer.noise_scale=off` and one with
the mode under test, and trained one epoch each in turn (the side that starts alternates), the
epoch's optimizer steps timed with `time.perf_counter`. The headline is the median over rounds
of the per-round ratio measured/off:

    auto    with accumulation (batch=accumulation): the squared norms of the first micro-batch's
            gradient and of the step's; no extra forward or backward pass;
    always  with one micro-batch: the whole step as without measuring, plus a forward and
            backward over half the batch on the side (generators and BatchNorm statistics put
            back), so the run is unchanged — the price of measuring where nothing is free. With
            BatchNorm the side forward is of the whole batch (the half's loss, normalised with
            the statistics the step trains on), which costs more.

Run from the repository root (or with $BSEXP_DATA set); any Hydra override may follow::

    python scripts/bench_noise_scale.py
    python scripts/bench_noise_scale.py --rounds 12 model=mlp
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bsexp.config.schema import register_configs  # noqa: E402
from bsexp.engine.step import train_step  # noqa: E402
from bsexp.runs.sweep import register_resolvers  # noqa: E402
from bsexp.train.loop import build_loop  # noqa: E402

CASES = {
    "auto (accumulation 4 x 32)": ["batch=accumulation", "batch.size=128", "batch.micro_size=32"],
    "always (one batch of 128, a half on the side)": ["batch.size=128"],
}


def epoch_seconds(loop, epoch: int) -> float:
    seconds = 0.0
    sizes = loop.batch_control.layout.run.epoch(epoch % len(loop.batch_control.layout.run.epoch_starts))
    for index, (x, y, samples) in enumerate(loop.feed.steps(epoch, sizes, 0, 1, loop.drop_last)):
        started = time.perf_counter()
        train_step(loop.step, x, y, samples, loop.batch_control.plan(index))
        seconds += time.perf_counter() - started
    return seconds


def compare(overrides: list[str], mode: str, rounds: int) -> tuple[float, int]:
    loops = {}
    for name in ("off", mode):
        with initialize_config_dir(config_dir=str(ROOT / "bsexp" / "conf"), version_base="1.3"):
            cfg = compose(
                "config", overrides=["logger=none", "trainer.progress=false", *overrides, f"trainer.noise_scale={name}"]
            )
        loops[name] = build_loop(cfg)
        loops[name].step.model.train()
    ratios = []
    for r in range(rounds + 1):
        order = ("off", mode) if r % 2 else (mode, "off")
        gc.disable()
        seconds = {name: epoch_seconds(loops[name], r) for name in order}
        gc.enable()
        gc.collect()
        if r:  # the first round warms up
            ratios.append(seconds[mode] / seconds["off"])
    return statistics.median(ratios), loops[mode].step.noise.scale.count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    args, overrides = parser.parse_known_args()
    register_configs()
    register_resolvers()
    torch.set_num_threads(torch.get_num_threads())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.rounds} rounds of one epoch per side")
    for label, case in CASES.items():
        mode = label.split()[0]
        ratio, measured = compare([*case, *overrides], mode, args.rounds)
        print(f"  {label:<42} step time {mode}/off = {ratio:.3f}   ({measured} measurements)")


if __name__ == "__main__":
    main()
