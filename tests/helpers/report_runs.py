"""Synthetic sweep points made from a known truth (a critical batch, an accuracy curve), as the
report reads them: one record per evaluation, with the steps and samples each step took."""

from __future__ import annotations

import math

from bsexp.report.analysis import Point

# MNIST-1D's training split: a batch of 1024 takes 4 steps an epoch, the last of 412 samples
# (875 a step on average), as bsexp trains with batch.drop_last=false.
N_TRAIN = 3500


def effective_batch(batch: int, n_train: int = N_TRAIN) -> float:
    """Samples per step actually taken over an epoch that keeps its smaller last step."""
    return n_train / math.ceil(n_train / batch)


def grown_steps(growth: float, total: int) -> set[int]:
    """The steps trainer.eval_growth=growth evaluates at (bsexp.engine.evaluate.Evaluator): 1, then each
    the first step at least (1 + growth) times the one before."""
    steps, mark = set(), 1
    while mark <= total:
        steps.add(mark)
        mark = max(mark + 1, math.ceil(mark * (1 + growth)))
    return steps


def synthetic_run(
    batch: int,
    seed: int,
    epochs: int,
    accuracy,
    n_train: int = N_TRAIN,
    eval_every: int = 1,
    eval_growth: float | None = None,
    **summary,
) -> dict:
    """One sweep point as bsexp writes it: its overrides, summary.json and metrics.jsonl records,
    with `accuracy(step)` the val_acc after that many optimizer steps, evaluated every `eval_every`
    steps and, with `eval_growth`, at the steps trainer.eval_growth adds. Each epoch ends with the
    smaller step that drop_last=false keeps."""
    records, step, samples = [], 0, 0
    sizes = [min(batch, n_train - start) for start in range(0, n_train, batch)]
    grown = grown_steps(eval_growth, epochs * len(sizes)) if eval_growth else set()
    for epoch in range(epochs):
        for i, size in enumerate(sizes):
            step, samples = step + 1, samples + size
            last = epoch == epochs - 1 and i == len(sizes) - 1
            if step % eval_every == 0 or step in grown or last:
                acc = accuracy(step)
                records.append(
                    {
                        "epoch": round(epoch + (i + 1) / len(sizes), 4),
                        "step": step,
                        "samples_seen": samples,
                        "val_acc": acc,
                        "val_loss": 2.5 * (1.02 - acc),
                        "train_acc": min(1.0, acc + 0.02),
                        "gen_gap": 0.02,
                    }
                )
    final = records[-1]["val_acc"]
    values = {
        "status": "completed",
        "batch_size": batch,
        "micro_size": batch,
        "accum_steps": 1,
        "world_size": 1,
        "lr": 0.1 * batch / 128,
        "weight_decay": 5e-4,
        "epochs": float(epochs),
        "steps": step,
        "samples_seen": samples,
        "val_acc": final,
        "test_acc": final,
        "train_acc": min(1.0, final + 0.02),
        "gen_gap": 0.02,
        "best_val_acc": max(r["val_acc"] for r in records),
        "wall_time_s": 0.01 * step,
        "samples_per_s": 1000.0 + batch,
        "peak_memory_mb": 100.0 + batch / 8,
        "seed": seed,
        "data": "mnist1d",
        "model": "bsexp.engine.models.CNN1d",
        "noise_b_simple": None,
        "noise_b_simple_mean": None,
        "noise_measurements": 0,
    } | summary
    return {"overrides": [f"batch.size={batch}", f"seed={seed}"], "summary": values, "records": records}


def known_b_crit_runs(
    b_crit: float = 5000,
    s_min: float = 20,
    batches=(64, 128, 256, 512, 1024),
    seeds=(0, 1),
    epochs: int = 60,
    chance: float = 0.1,
    top: float = 0.9,
    eval_every: int = 1,
) -> list[dict]:
    """Runs whose accuracy after s steps is chance + (top - chance)(1 - exp(-s / S)), with
    S = s_min (1 + b_crit / B) for B the samples per step actually taken (seeds 1 % apart): the
    steps to ANY accuracy then follow (S/S_min - 1)(E/E_min - 1) = 1 with B_crit = b_crit."""
    runs = []
    for batch in batches:
        for seed in seeds:
            scale = s_min * (1 + b_crit / effective_batch(batch)) * (1 + 0.01 * (2 * seed - 1))
            curve = lambda s, k=scale: chance + (top - chance) * (1 - math.exp(-s / k))  # noqa: E731
            runs.append(synthetic_run(batch, seed, epochs, curve, eval_every=eval_every))
    return runs


def points(runs: list[dict]) -> list[Point]:
    return [
        Point(
            name=f"{i}_{','.join(r['overrides'])}",
            setting=tuple(o for o in r["overrides"] if not o.startswith("seed=")),
            overrides=tuple(r["overrides"]),
            summary=r["summary"],
            records=r["records"],
            status=r["summary"]["status"],
        )
        for i, r in enumerate(runs)
    ]
