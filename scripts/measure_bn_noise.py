"""How BatchNorm moves the one-process estimate of the gradient noise scale.

With one micro-batch on one process, bsexp measures B_simple from the gradient over half of the
step's batch (B_small) against the step's (B_big). With BatchNorm the half can be normalised over
itself (a forward of the half alone, as bsexp did before 2026-11-25) or with the whole batch's
statistics (the whole batch's forward, the half's loss: what training normalises with, and what
bsexp does now). This trains cnn1d on MNIST-1D for a while, freezes it, and prints the estimates of
|G|² and tr(Σ) (McCandlish et al. 2018, App. A.1), averaged over many draws, at several batch
sizes, for both. Without a batch-dependent layer both would be the same and would not move with
the batch.

    python scripts/measure_bn_noise.py                       # 150 steps of training, 200 draws a size
    python scripts/measure_bn_noise.py --draws 500 --norm none
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bsexp.engine.datasets import mnist1d  # noqa: E402 (after the checkout is put on the path)
from bsexp.engine.gradient_noise import estimates, squared_norm  # noqa: E402
from bsexp.engine.models import CNN1d  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=150, help="training steps (batch 128) before freezing")
    parser.add_argument("--draws", type=int, default=200, help="batches drawn at each size")
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    parser.add_argument("--norm", default="batch")
    args = parser.parse_args()
    torch.manual_seed(0)
    train = mnist1d(os.environ.get("BSEXP_DATA", str(ROOT / "data")), 500, 0, 5000, 0.8).train
    x, y = train.x, train.y
    net = CNN1d((1, 40), 10, 32, args.norm)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    draw = torch.Generator().manual_seed(0)
    for _ in range(args.steps):
        i = torch.randint(len(y), (128,), generator=draw)
        optimizer.zero_grad()
        F.cross_entropy(net(x[i]), y[i]).backward()
        optimizer.step()
    params = list(net.parameters())  # the net stays in train mode: BatchNorm normalises over its input

    def grad_sq(inputs, labels, n_loss: int) -> torch.Tensor:
        loss = F.cross_entropy(net(inputs)[:n_loss], labels[:n_loss])
        return squared_norm(list(torch.autograd.grad(loss, params)))

    print(f"cnn1d (norm={args.norm}) after {args.steps} steps, frozen; mean over {args.draws} draws a size")
    print(f"{'B_big':>6} | {'own statistics: |G|^2':>22} {'tr(Σ)':>8} | {'whole batch: |G|^2':>19} {'tr(Σ)':>8}")
    for size in args.sizes:
        half = size // 2
        sums = {"own": [0.0, 0.0], "whole": [0.0, 0.0]}
        for _ in range(args.draws):
            i = torch.randint(len(y), (size,), generator=draw)
            big = grad_sq(x[i], y[i], size)
            smalls = {"own": grad_sq(x[i][:half], y[i][:half], half), "whole": grad_sq(x[i], y[i], half)}
            for name, small in smalls.items():
                g2, trace = estimates(small, half, big, size)
                sums[name][0] += g2.item() / args.draws
                sums[name][1] += trace.item() / args.draws
        print(
            f"{size:>6} | {sums['own'][0]:>22.3f} {sums['own'][1]:>8.1f} | {sums['whole'][0]:>19.3f} "
            f"{sums['whole'][1]:>8.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
