"""Training speed on one device: bsexp's reproducible path, its fast path (trainer.speed=fast), and a
best-practice hand-written loop doing the same work (issue 44).

    python scripts/bench_gpu.py                      # on the GPU if there is one, else the CPU
    python scripts/bench_gpu.py --steps 40 --cases mnist1d

Two cases, each on the device at hand:
    resnet18  ResNet-18 on 3 x 32 x 32 synthetic images, bf16, batch 512 (on a CPU: a small conv
              net, batch 128: ResNet-18 takes minutes a step there)
    mnist1d   the default run: the 1-D conv net on MNIST-1D, fp32, batch 128

For each: bsexp's training step (the one the loop runs: bsexp.engine.step.train_step with the LR written
for the step) built from the real config with trainer.speed=reproducible, =fast (eager, the
default) and =fast with trainer.compile_mode=default; and the hand loop, written as a person who
knows the tricks would: the same architecture in channels_last (for images), torch.compile (with
CUDA graphs on CUDA, reduce-overhead: safe there, since it never accumulates), a fused SGD, bf16
autocast, index batches on the device, no host synchronisation in the loop; and the same loop
eager, as bsexp's fast path runs by default (bsexp's own overhead apart from the compile's gain).
Every side trains `--warmup` untimed steps first (the compile, cuDNN's autotuner, the allocator),
then `--steps` timed ones between two synchronisations.
Prints samples/s, the ratios (goal: fast >= 0.95 x the hand loop), the FLOPs of one step
(torch.utils.flop_counter), the TFLOP/s achieved and, for a GPU whose bf16 peak is known, the
fraction of it. A measurement, not a test: the exit code is 0.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bsexp.config.schema import register_configs  # noqa: E402 (after the checkout is put on the path)
from bsexp.engine.step import train_step  # noqa: E402
from bsexp.runs.sweep import register_resolvers  # noqa: E402 (after the checkout is put on the path)
from bsexp.system.runtime import DTYPES  # noqa: E402
from bsexp.train.loop import Loop, build_loop  # noqa: E402

GOAL = 0.95
# Dense bf16 tensor-core peaks (TFLOP/s), from the vendors' data sheets.
PEAK_BF16 = {"H100": 989.4, "H200": 989.4, "A100": 312.0, "L40S": 362.1, "A10G": 70.0}
CASES = {
    "resnet18": {
        "cuda": [
            "data=synthetic",
            "data.shape=[3,32,32]",
            "data.num_samples=20480",
            "model=resnet18",
            "precision=bf16",
            "batch.size=512",
        ],
        "cpu": [
            "data=synthetic",
            "data.shape=[3,32,32]",
            "data.num_samples=4096",
            "model=cnn",
            "model.width=16",
            "precision=bf16",
            "batch.size=128",
        ],
    },
    "mnist1d": {"cuda": [], "cpu": []},  # the default run
}


def build(overrides: list[str], speed: str) -> Loop:
    register_configs()
    register_resolvers()
    with initialize_config_dir(config_dir=str(ROOT / "bsexp" / "conf"), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "logger=none",
                "trainer.progress=false",
                f"trainer.speed={speed}",
                "data.val_size=128",
                *overrides,
            ],
        )
    return build_loop(cfg)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(step, device: torch.device, warmup: int, steps: int) -> float:
    """Seconds for `steps` calls of step(index) after `warmup` untimed ones, the device synchronised
    at both ends."""
    for index in range(warmup):
        step(index)
    sync(device)
    started = time.perf_counter()
    for index in range(warmup, warmup + steps):
        step(index)
    sync(device)
    return time.perf_counter() - started


def bsexp_rate(loop: Loop, warmup: int, steps: int) -> float:
    """Samples/s of bsexp's step, as the loop runs it (the LR written, then train_step)."""
    run, device = loop.batch_control.layout.run, loop.world.device
    batches = iter(loop.batches.steps(0, run.epoch(0), drop_last=True))

    def step(index: int) -> None:
        nonlocal batches
        try:
            x, y, samples = next(batches)
        except StopIteration:
            batches = iter(loop.batches.steps(index, run.epoch(0), drop_last=True))
            x, y, samples = next(batches)
        loop.hyperparameters.apply(index % run.total, loop.batch_control.layout)
        train_step(loop.step, x, y, samples, loop.batch_control.plan(0))

    return steps * loop.batch_control.current.size / timed(step, device, warmup, steps)


def hand_rate(loop: Loop, precision: str, mode: str | None, warmup: int, steps: int) -> tuple[float, float]:
    """Samples/s of the best-practice loop on the same architecture and data, and the FLOPs of
    one of its steps (forward and backward)."""
    import copy

    device = loop.world.device
    model = copy.deepcopy(loop.step.net)
    images = loop.batches.split.x.dim() == 4
    if images:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4, fused=True)
    compiled = torch.compile(model, mode=mode) if mode else model
    x_all, y_all, batch = loop.batches.split.x, loop.batches.split.y, loop.batch_control.current.size
    dtype = DTYPES.get(precision)
    autocast = torch.autocast(device.type, dtype=dtype) if dtype else torch.autocast(device.type, enabled=False)

    def step(index: int, net=compiled) -> None:
        start = (index * batch) % (len(y_all) - batch)
        x, y = x_all[start : start + batch], y_all[start : start + batch]
        if images:
            x = x.contiguous(memory_format=torch.channels_last)
        with autocast:
            loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        step(0, net=model)  # eager, once: what one step computes
    return steps * batch / timed(step, device, warmup, steps), counter.get_total_flops()


def measure(case: str, device: str, peak: float | None, warmup: int, steps: int) -> str:
    """One case's row: bsexp's reproducible path, its fast path (eager) and the fast path
    compiled (trainer.compile_mode=default), and the hand loop."""
    overrides = [f"device={device}", *CASES[case][device]]
    rates = {
        name: bsexp_rate(build(overrides + extra, speed), warmup, steps)
        for name, speed, extra in (
            ("reproducible", "reproducible", []),
            ("fast", "fast", []),
            ("compiled", "fast", ["trainer.compile_mode=default"]),
        )
    }
    fast_loop = build(overrides, "fast")
    precision = next((o.split("=")[1] for o in overrides if o.startswith("precision=")), "fp32")
    # The hand loop with CUDA graphs on CUDA (it never accumulates, so they are safe there; bsexp's
    # fast path cannot use them: bsexp.config.checks.COMPILE_MODES).
    mode = "reduce-overhead" if device == "cuda" else "default"
    hand, flops = hand_rate(fast_loop, precision, mode, warmup, steps)
    # And eager, as bsexp's fast path runs: what is bsexp's own overhead, and what the compile's gain.
    hand_eager, _ = hand_rate(fast_loop, precision, None, warmup, steps)
    achieved = flops / fast_loop.batch_control.current.size * rates["fast"] / 1e12
    fraction = f"{100 * achieved / peak:.1f} %" if peak and device == "cuda" else "-"
    return (
        f"| {case} | {rates['reproducible']:,.0f} | {rates['fast']:,.0f} | {rates['compiled']:,.0f} | {hand:,.0f} | "
        f"{hand_eager:,.0f} | {rates['fast'] / hand:.2f} | {rates['fast'] / hand_eager:.2f} | "
        f"{rates['fast'] / rates['reproducible']:.2f} | {flops / 1e9:,.1f} | {achieved:.2f} | {fraction} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50, help="timed steps a side (50)")
    parser.add_argument("--warmup", type=int, default=15, help="untimed steps first (15: the compile and more)")
    parser.add_argument("--cases", default="resnet18,mnist1d", help="comma-separated: resnet18, mnist1d")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    args = parser.parse_args()
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device.replace("auto", "cpu")
    name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
    print(f"{name}; torch {torch.__version__}; {args.steps} timed steps a side after {args.warmup}")
    print(
        "| case | reproducible samples/s | fast samples/s | fast, compiled samples/s | hand loop samples/s "
        "| hand loop, eager samples/s | fast / hand | fast / hand eager | fast / reproducible | GFLOP a step "
        "| TFLOP/s (fast) | of bf16 peak |"
    )
    print("|" + " --- |" * 12)
    for case in args.cases.split(","):
        try:
            print(measure(case, device, peak, args.warmup, args.steps), flush=True)
        except Exception as exc:  # one case's failure is a row, and the next case runs
            why = " ".join(str(exc).split())[:300].replace("|", "/")
            print(f"| {case} | failed: {type(exc).__name__}: {why} |" + " |" * 10, flush=True)
    print(
        f"goal: fast / hand >= {GOAL} on each case; resnet18 on an H100/H200 >= 40,000 samples/s; the "
        f"default run on a GPU >= 4x its samples/s on 2 CPU cores"
    )


if __name__ == "__main__":
    main()
