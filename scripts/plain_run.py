"""The default run written by hand, without bsexp: the baseline `scripts/bench_overhead.py --whole`
times `python -m bsexp.train logger=none` against, as whole processes (issue 54).

    python scripts/plain_run.py OUT_DIR [--threads N] [--data DIR]

What `python -m bsexp.train` does by default, as a person would write it: MNIST-1D from the file
bsexp caches (`<data>/mnist1d/mnist1d-n5000-s42-t0.8.pt`; bsexp writes it on its first run), 500
of the 4,000 training samples held out for validation; the same 1-D conv net (three stages of two
3-wide convs with BatchNorm and ReLU, average pooling, a linear head: 97,514 parameters); SGD (lr
0.1, momentum 0.9, weight decay 5e-4 on the weights, none on norms and biases), batch 128, 20
epochs, the LR warmed up linearly over 2 epochs then cosine to 0; after every epoch an evaluation
(500 training samples and the 500 validation samples, in eval mode, batches of 1,024), a line of
metrics in metrics.jsonl and a checkpoint (model, optimizer, epoch; the last two kept); at the end
the test split and summary.json. No Hydra, no config, no registry, no progress bar.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

started = time.perf_counter()


def block(c_in: int, c_out: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv1d(c_in, c_out, 3, stride=stride, padding=1, bias=False), nn.BatchNorm1d(c_out), nn.ReLU()
    )


def model(width: int = 32, classes: int = 10) -> nn.Sequential:
    layers, c = [], 1
    for stage, w in enumerate((width, 2 * width, 4 * width)):
        layers += [block(c, w, 1 if stage == 0 else 2), block(w, w, 1)]
        c = w
    return nn.Sequential(*layers, nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(c, classes))


@torch.no_grad()
def evaluate(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    net.eval()
    loss = correct = 0.0
    for start in range(0, len(y), 1024):
        logits = net(x[start : start + 1024])
        loss += F.cross_entropy(logits, y[start : start + 1024], reduction="sum").item()
        correct += (logits.argmax(1) == y[start : start + 1024]).sum().item()
    net.train()
    return loss / len(y), correct / len(y)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("BSEXP_DATA", "data")))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    data = torch.load(args.data / "mnist1d" / "mnist1d-n5000-s42-t0.8.pt")
    order = torch.randperm(len(data["y"]), generator=torch.Generator().manual_seed(42))
    train_x, train_y = data["x"][order[500:]], data["y"][order[500:]]
    val_x, val_y = data["x"][order[:500]], data["y"][order[:500]]
    net = model()
    decay = [p for p in net.parameters() if p.ndim > 1]
    rest = [p for p in net.parameters() if p.ndim <= 1]
    groups = [{"params": decay, "weight_decay": 5e-4}, {"params": rest, "weight_decay": 0.0}]
    opt = torch.optim.SGD(groups, lr=0.1, momentum=0.9)
    steps_per_epoch, epochs = math.ceil(len(train_y) / 128), 20
    warmup, total = 2 * steps_per_epoch, epochs * steps_per_epoch

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    args.out.mkdir(parents=True, exist_ok=True)
    metrics, train_time, step = open(args.out / "metrics.jsonl", "w"), 0.0, 0
    for epoch in range(epochs):
        began = time.perf_counter()
        perm = torch.randperm(len(train_y))
        loss_sum = correct = 0.0
        for start in range(0, len(train_y), 128):
            idx = perm[start : start + 128]
            x, y = train_x[idx], train_y[idx]
            opt.zero_grad(set_to_none=True)
            logits = net(x)
            loss = F.cross_entropy(logits, y)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            loss_sum += loss.detach() * len(y)
            correct += (logits.detach().argmax(1) == y).sum()
        train_time += time.perf_counter() - began
        train_eval_loss, train_acc = evaluate(net, train_x[:500], train_y[:500])
        val_loss, val_acc = evaluate(net, val_x, val_y)
        record = {"epoch": epoch + 1, "step": step, "train_loss": float(loss_sum) / len(train_y)}
        record |= {"train_acc": train_acc, "val_loss": val_loss, "val_acc": val_acc, "lr": sched.get_last_lr()[0]}
        metrics.write(json.dumps(record) + "\n")
        metrics.flush()
        print(
            f"epoch {epoch + 1}: " + " ".join(f"{k} {v:.4f}" for k, v in record.items() if k.endswith(("loss", "acc")))
        )
        torch.save(
            {"model": net.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch + 1},
            args.out / f"ckpt-{epoch + 1}.pt",
        )
        (args.out / f"ckpt-{epoch - 1}.pt").unlink(missing_ok=True)
    metrics.close()
    test_loss, test_acc = evaluate(net, data["x_test"], data["y_test"])
    summary = {**record, "test_loss": test_loss, "test_acc": test_acc, "train_time_s": train_time}
    summary["wall_time_s"] = time.perf_counter() - started
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"val acc {val_acc:.4f}, test acc {test_acc:.4f}, train {train_time:.1f} s")


if __name__ == "__main__":
    main()
