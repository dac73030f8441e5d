"""The graphed step without its capture (trainer.cuda_graphs=static): static gradients zeroed in
place, one recorded step per key replayed, the LR a tensor written in place, the rows gathered by
the step. On the CPU it must train exactly as the eager step does — accumulation, a batch that
changes between keys, the noise meter, a resumed run, more keys than the cache holds — so that on a
GPU only the capture is new (tests/gpu holds the captured step to the same)."""

import subprocess
import sys

import pytest
import torch

from bsexp.engine.evaluate import evaluate
from bsexp.engine.feed import Rows
from bsexp.runs import checkpoint as ckpt
from bsexp.train.loop import TrainState, build_loop, train
from conftest import HELPERS, cli_env
from tiny import TINY, params

ACCUMULATE = ["batch=accumulation", "batch.size=32", "batch.micro_size=8"]
# The batch doubles every epoch (32, 64, 128) and each epoch ends in a shorter step.
GROWING = ["batch=scheduled", "batch.size=32", "batch.schedule.milestones=[1,2]", "batch.schedule.factor=2", "epochs=3"]


def trained(make_cfg, *overrides, graphs="static"):
    loop, state = build_loop(make_cfg(*TINY, *overrides, f"trainer.cuda_graphs={graphs}")), TrainState()
    assert train(loop, state) == "completed"
    return loop, state


def assert_same_run(static, eager):
    (loop, state), (eager_loop, eager_state) = static, eager
    a, b = params(loop), params(eager_loop)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "parameters differ"
    assert [r["train_loss"] for r in state.records] == [r["train_loss"] for r in eager_state.records]
    assert [r["val_loss"] for r in state.records] == [r["val_loss"] for r in eager_state.records]


@pytest.mark.parametrize("speed", ["reproducible", "fast"])
def test_accumulated_steps_replayed_on_static_gradients_train_bit_for_bit_as_the_eager_step(make_cfg, speed):
    common = [*ACCUMULATE, f"trainer.speed={speed}", "trainer.max_steps=9", "trainer.eval_every_steps=3"]
    static = trained(make_cfg, *common)
    eager = trained(make_cfg, *common, graphs="off")
    assert static[0].step.graphs is not None and eager[0].step.graphs is None
    # Two eager warm-ups of the one key, then its recorded step replayed seven times.
    summary = static[0].step.graphs.summary()
    assert summary == {"mode": "static", "captured": 1, "replays": 7, "eager_steps": 2, "evicted": 0, "disabled": None}
    # The gradients were never set to None: the same tensors, allocated once, after nine steps.
    graphs = static[0].step.graphs
    assert all(p.grad is g for p, g in zip(graphs.params, graphs.grads))
    assert_same_run(static, eager)
    # The noise meter measured each accumulated step through the replays as the eager step did.
    noise, eager_noise = static[0].step.noise.scale.summary(), eager[0].step.noise.scale.summary()
    assert noise["noise_measurements"] == 9 and noise == eager_noise


def test_the_lr_is_a_tensor_written_in_place_each_step_and_follows_its_warmup(make_cfg):
    warm = ["schedule.warmup_shape=linear", "schedule.unit=steps", "schedule.warmup=6", "schedule.main=cosine"]
    common = [*ACCUMULATE, *warm, "trainer.max_steps=8", "trainer.eval_every_steps=4"]
    static = trained(make_cfg, *common)
    eager = trained(make_cfg, *common, graphs="off")
    groups = static[0].step.optimizer.param_groups
    assert all(isinstance(g["lr"], torch.Tensor) and g["lr"] is groups[0]["lr"] for g in groups)  # one, shared
    assert not isinstance(eager[0].step.optimizer.param_groups[0]["lr"], torch.Tensor)
    assert [r["lr"] for r in static[1].records] == [r["lr"] for r in eager[1].records]
    assert_same_run(static, eager)


def test_a_batch_that_changes_between_keys_trains_as_the_eager_step_with_the_short_steps_eager(make_cfg):
    static = trained(make_cfg, *GROWING)
    eager = trained(make_cfg, *GROWING, graphs="off")
    assert_same_run(static, eager)
    summary = static[0].step.graphs.summary()
    # 512 training samples: epochs of 15 x 32 + 32, 7 x 64 + 64, 4 x 128 - each epoch's last step
    # is full here, so three keys; two warm-ups each.
    assert summary["captured"] == 3 and summary["eager_steps"] == 6
    assert summary["replays"] == static[1].step - 6


def test_more_keys_than_the_cache_holds_are_captured_again_and_train_the_same(make_cfg):
    # 100 samples in steps of 32: 32, 32, 20 each epoch, and 2 epochs a batch: the batch grows
    # 32 -> 64 after 2 epochs, a short last step each epoch, run eagerly.
    shape = ["data.num_samples=188", "data.val_size=16", "epochs=6", "batch=scheduled", "batch.size=16"]
    grow = [*shape, "batch.schedule.milestones=[2,4]", "batch.schedule.factor=2"]
    eager = trained(make_cfg, *grow, graphs="off")
    loop = build_loop(make_cfg(*TINY, *grow, "trainer.cuda_graphs=static"))
    loop.step.graphs.cache.capacity = 1  # each new batch drops the graph of the one before
    state = TrainState()
    assert train(loop, state) == "completed"
    summary = loop.step.graphs.summary()
    assert summary["captured"] == 3 and summary["evicted"] == 2 and summary["eager_steps"] > 6
    assert_same_run((loop, state), eager)


def test_a_closed_loop_batch_trains_as_the_eager_step(make_cfg):
    adaptive = [
        "batch=adaptive",
        "batch.size=16",
        "batch.micro_size=8",  # accumulated: the noise is measured for free, inside the step
        "batch.find_micro_size=false",
        "batch.adaptive.interval=4",
        "epochs=2",
    ]
    static = trained(make_cfg, *adaptive)
    eager = trained(make_cfg, *adaptive, graphs="off")
    sizes = set(static[0].batch_control.layout.run.sizes)
    assert len(sizes) >= 2, sizes  # the batch did move
    assert static[0].batch_control.layout.run.sizes == eager[0].batch_control.layout.run.sizes
    assert static[0].step.graphs.summary()["captured"] >= 2
    assert_same_run(static, eager)


def test_a_run_resumed_mid_way_on_the_static_step_ends_as_the_uninterrupted_one(make_cfg, tmp_path):
    saving = ["checkpoint.every_steps=5", "checkpoint.keep=5"]
    common = [*ACCUMULATE, "trainer.max_steps=12", "trainer.eval_every_steps=4", *saving]
    whole, whole_state = trained(make_cfg, *common)
    cfg = make_cfg(*TINY, *common, "trainer.cuda_graphs=static")
    first = build_loop(cfg, run_dir=tmp_path)
    state = TrainState()
    first.checkpointer.start(first, state)
    assert train(first, state) == "completed"
    path = tmp_path / "checkpoints" / "step-000000005.pt"
    saved = ckpt.load(path)
    assert isinstance(saved["optimizer"]["param_groups"][0]["lr"], torch.Tensor)  # the LR tensor is saved
    resumed = build_loop(cfg, resumed=saved)
    again = TrainState()
    ckpt.restore(cfg, resumed, again, path, saved)
    assert again.step == 5 and train(resumed, again) == "completed"
    assert resumed.step.graphs.summary()["captured"] == 1  # captured after the resume's own warm-ups
    a, b = params(resumed), params(whole)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert again.records[-1]["val_loss"] == whole_state.records[-1]["val_loss"]


def test_the_feed_leaves_the_gather_to_the_graphed_step_and_the_eager_one_gathers_as_before(make_cfg):
    static, _ = trained(make_cfg, "trainer.max_steps=1")
    eager, _ = trained(make_cfg, "trainer.max_steps=1", graphs="off")
    sizes = static.batch_control.epoch_sizes(0)
    (x, y, samples), (ex, ey, eager_samples) = next(static.feed.steps(0, sizes)), next(eager.feed.steps(0, sizes))
    assert isinstance(x, Rows) and x is y and samples == eager_samples
    gathered = x.gather()
    assert torch.equal(gathered[0], ex) and torch.equal(gathered[1], ey)


def test_evaluation_in_one_shape_gives_the_same_loss_and_accuracy(make_cfg):
    loop, _ = trained(make_cfg, "trainer.max_steps=3", "data.val_size=100", graphs="off")
    step = loop.step
    plain = evaluate(step.net, loop.splits.val, step.world, step.autocast, 32)  # 32, 32, 32, 4
    padded = evaluate(step.net, loop.splits.val, step.world, step.autocast, 32, one_shape=True)  # 4 x 25
    once = evaluate(step.net, loop.splits.val, step.world, step.autocast, 1000)
    assert padded[1] == plain[1] == once[1]
    assert padded[0] == pytest.approx(plain[0], rel=1e-6) and padded[0] == pytest.approx(once[0], rel=1e-6)
    odd = evaluate(step.net, loop.splits.val, step.world, step.autocast, 33, one_shape=True)  # 34, 34, 32 + 2 padded
    assert odd[1] == plain[1] and odd[0] == pytest.approx(plain[0], rel=1e-6)


# Memory grows fast with the batch and compute does not: one wide hidden layer on 40 inputs
# (tests/loop/test_scheduled.py's real out-of-memory errors, under a cap on the address space).
WIDE = [
    "data=synthetic",
    "data.shape=[1,40]",
    "data.val_size=200",
    "data.num_samples=4300",
    "model=mlp",
    "model.hidden=[8192]",
    "model.norm=none",
    "trainer.eval_batch_size=256",
    "schedule.warmup_shape=none",
    "epochs=2",
    "batch.size=2048",
    # 4,100 samples an epoch: 2048, 2048, 4 (short: eager). After the first step's halving, two
    # warm-ups of the new key, then its capture and one replay.
    "trainer.max_steps=5",
]


def capped_train(tmp_path, name, room_mb, *overrides):
    """bsexp's training in a fresh process capped at what it holds plus room_mb (tests/helpers/capped_train.py)."""
    out = tmp_path / f"{name}.pt"
    done = subprocess.run(
        [sys.executable, str(HELPERS / "capped_train.py"), str(out), str(room_mb), *overrides],
        capture_output=True,
        text=True,
        timeout=300,
        env=cli_env(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out, weights_only=False), done.stderr


@pytest.mark.slow  # two capped training processes, 20-50 s on 2 cores: scripts/test_slow.sh runs it
def test_a_real_oom_in_the_static_step_halves_the_micro_batch_and_trains_as_the_eager_step_does(tmp_path):
    # 2048 samples need about 0.5 GB in this model's step: 150 MB above what the process holds is far too little.
    static, stderr = capped_train(tmp_path, "static", 150, *WIDE, "trainer.cuda_graphs=static")
    plan = static["plan"]
    assert static["status"] == "completed" and static["oom_recoveries"] >= 1
    assert plan.size == 2048 and plan.micro_size == 2048 >> static["oom_recoveries"]
    assert "out of memory at micro-batch 2048" in stderr
    assert static["graphs"]["captured"] == 1 and static["graphs"]["replays"] == 1  # the recovered key
    eager, _ = capped_train(tmp_path, "eager", 150, *WIDE, "trainer.cuda_graphs=off")
    assert eager["plan"] == plan and eager["oom_recoveries"] == static["oom_recoveries"]
    for key, value in static["params"].items():
        assert torch.equal(value, eager["params"][key]), key


@pytest.mark.slow  # two finders' searches in probe processes: 30-60 s on 2 cores
def test_the_finders_trials_run_the_static_step_and_find_what_the_eager_ones_find(make_cfg):
    # The trials run past the warm-ups (their capture in the peak on a GPU) and set the gradients to
    # None between sizes: the step allocates them anew. The found size trains as eagerly found.
    # The data bound the search (a tenth of 1,800 samples: 180), far below where memory runs out;
    # margin 0, or whether the CPU's noisy room measured that edge or not sets the margin (171 in CI).
    finder = [*WIDE[:3], "data.num_samples=2000", "model=mlp", "model.hidden=[64]", "batch=finder"]
    common = [*finder, "batch.finder.max_size=200", "batch.finder.margin=0", "trainer.max_steps=3"]
    common.append("trainer.progress=false")
    static = build_loop(make_cfg(*common, "trainer.cuda_graphs=static"))
    eager = build_loop(make_cfg(*common, "trainer.cuda_graphs=off"))
    assert static.batch_control.current.size == eager.batch_control.current.size == 180
    assert static.batch_control.found.trials and static.step.graphs is not None
    for loop in (static, eager):
        assert train(loop, TrainState()) == "completed"
    assert static.step.graphs.summary()["replays"] == 1
    a, b = params(static), params(eager)
    assert all(torch.equal(a[k], b[k]) for k in a)
