"""The loop's arithmetic: accumulation equals one big batch, exact normalisation, honest logs."""

import math
from copy import deepcopy

import pytest
import torch
import torch.nn.functional as F

from bsexp.engine.feed import eval_batches
from bsexp.engine.step import train_step
from bsexp.train.loop import TrainState, build_loop, train
from tiny import TINY, assert_close, params


def trained(make_cfg, *overrides):
    cfg = make_cfg(*TINY, *overrides)
    loop, progress = build_loop(cfg), TrainState()
    assert train(loop, progress) == "completed"
    return loop, progress


def test_micro_8_times_4_equals_one_batch_of_32(make_cfg):
    big, _ = trained(make_cfg, "batch.size=32", "trainer.max_steps=3")
    accum, _ = trained(make_cfg, "batch=accumulation", "batch.size=32", "batch.micro_size=8", "trainer.max_steps=3")
    assert accum.batch_control.current.accum_steps == 4 and big.batch_control.current.accum_steps == 1
    start = build_loop(make_cfg(*TINY, "batch.size=32"))
    moved = max((big.step.model.state_dict()[k] - v).abs().max() for k, v in start.step.model.state_dict().items())
    assert moved > 1e-3  # the three steps did change the parameters
    assert_close(params(big), params(accum), atol=1e-6)


def test_a_smaller_last_step_is_normalised_by_its_own_samples(make_cfg):
    # 84 training samples in steps of 32: 32, 32, 20; the last one as micro-batches of 16 + 4.
    shape = ["data.num_samples=100", "data.val_size=16", "epochs=2"]
    big, big_progress = trained(make_cfg, *shape, "batch.size=32")
    accum, _ = trained(make_cfg, *shape, "batch=accumulation", "batch.size=32", "batch.micro_size=16")
    assert big_progress.step == 6 and big_progress.samples_seen == 168
    assert_close(params(big), params(accum), atol=1e-6)


def test_drop_last_skips_the_partial_step(make_cfg):
    _, progress = trained(make_cfg, "data.num_samples=100", "data.val_size=16", "batch.size=32", "batch.drop_last=true")
    assert progress.step == 20 * 2 and progress.samples_seen == 20 * 64


def test_running_train_loss_is_the_mean_over_every_micro_batch(make_cfg):
    # With a vanishing LR the model stays put, so the epoch's running loss must equal the loss of
    # the whole training set, whatever the micro-batch_control (the last micro-batch is smaller).
    loop, progress = trained(
        make_cfg,
        "batch=accumulation",
        "batch.size=64",
        "batch.micro_size=16",
        "optimizer.lr=1e-12",
        "optimizer.weight_decay=0",
        "epochs=1",
    )
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in eval_batches(loop.splits.train, 1000, loop.world.device):
            total += F.cross_entropy(loop.step.model(x), y, reduction="sum").item()
            count += len(y)
    assert count == 512 and len(loop.splits.train) % 16 == 0  # 512 = 8 steps of 64
    record = progress.records[-1]
    assert record["train_loss"] == pytest.approx(total / count, rel=1e-5)


def test_train_accuracy_is_measured_like_validation(make_cfg):
    # With BatchNorm and heavy dropout, train mode and eval mode disagree; the record's train_acc
    # must be the eval-mode accuracy of a fixed train sample as large as val, not the running one.
    loop, progress = trained(make_cfg, "model.norm=batch", "model.dropout=0.5", "epochs=2")
    assert len(loop.splits.train_eval) == len(loop.splits.val) == 88
    train_ids = {tuple(row.tolist()) for row in loop.splits.train.x.flatten(1)}
    assert all(tuple(row.tolist()) in train_ids for row in loop.splits.train_eval.x.flatten(1))
    loop.step.model.eval()
    with torch.no_grad():
        x, y = loop.splits.train_eval.x, loop.splits.train_eval.y
        eval_acc = (loop.step.model(x).argmax(1) == y).float().mean().item()
        loop.step.model.train()
        train_mode_acc = (loop.step.model(x).argmax(1) == y).float().mean().item()
    record = progress.records[-1]
    assert record["train_acc"] == pytest.approx(eval_acc)
    assert train_mode_acc != pytest.approx(eval_acc)  # the measurement mode matters here
    assert record["gen_gap"] == pytest.approx(record["train_acc"] - record["val_acc"])
    assert [r["epoch"] for r in progress.records] == [1, 2]
    assert progress.records[-1]["samples_seen"] == 2 * len(loop.splits.train)


def test_a_run_cut_short_within_an_epoch_says_how_much_of_it_it_trained(make_cfg):
    # 84 training samples in steps of 32: 32, 32, 20. Four steps: one epoch and a third of the
    # next, not two epochs (the one step laid out for the cut second epoch is not all of it).
    loop, progress = trained(
        make_cfg,
        "data.num_samples=100",
        "data.val_size=16",
        "epochs=2",
        "batch.size=32",
        "trainer.max_steps=4",
        "trainer.eval_every_steps=1",
    )
    assert [r["samples_seen"] for r in progress.records] == [32, 64, 84, 116]
    assert [r["epoch"] for r in progress.records] == pytest.approx([1 / 3, 2 / 3, 1, 4 / 3], abs=1e-4)
    assert loop.batch_control.epochs_done(progress) == pytest.approx(4 / 3)


def test_same_seed_same_parameters_other_seed_other_parameters(make_cfg):
    a, _ = trained(make_cfg, "trainer.max_steps=5")
    b, _ = trained(make_cfg, "trainer.max_steps=5")
    c, _ = trained(make_cfg, "trainer.max_steps=5", "seed=1")
    assert all(torch.equal(a.step.model.state_dict()[k], v) for k, v in b.step.model.state_dict().items())
    assert not all(torch.equal(a.step.model.state_dict()[k], v) for k, v in c.step.model.state_dict().items())


def test_scaled_lr_warmup_and_weight_decay_reach_the_optimizer(make_cfg):
    # batch 512 at ref 128: k = 4, lr 0.1 -> 0.4 (linear), wd 5e-4 -> 1e-3 (sqrt); warmup from 0.1.
    cfg = make_cfg(
        *TINY,
        "data.num_samples=3160",
        "batch.size=512",
        "schedule.warmup_shape=linear",
        "schedule.unit=steps",
        "schedule.warmup=4",
        "trainer.max_steps=6",
    )
    loop = build_loop(cfg)
    decay, no_decay = loop.step.optimizer.param_groups
    assert decay["weight_decay"] == pytest.approx(1e-3) and no_decay["weight_decay"] == 0.0
    assert all(p.ndim == 1 for p in no_decay["params"]) and all(p.ndim > 1 for p in decay["params"])
    seen = []
    for step, (x, y, samples) in enumerate(loop.feed.steps(0, loop.batch_control.layout.run.epoch(0))):
        loop.hyperparameters.apply(step, loop.batch_control.layout)  # the loop writes each step's LR before it
        seen.append(loop.step.optimizer.param_groups[0]["lr"])
        train_step(loop.step, x, y, samples, loop.batch_control.plan(step))
        if step == 5:
            break
    assert seen == pytest.approx([0.1, 0.175, 0.25, 0.325, 0.4, 0.4])


def test_gradient_clipping_bounds_the_update(make_cfg):
    # Plain SGD, one step: the update is lr x the clipped gradient, so its norm is at most lr x clip.
    overrides = ["optimizer.momentum=0", "optimizer.weight_decay=0", "optimizer.lr=1.0", "trainer.max_steps=1"]
    cfg = make_cfg(*TINY, *overrides, "trainer.clip_grad_norm=0.01")
    loop = build_loop(cfg)
    before = torch.cat([p.detach().flatten().clone() for p in loop.step.model.parameters()])
    train(loop, TrainState())
    after = torch.cat([p.detach().flatten() for p in loop.step.model.parameters()])
    assert (after - before).norm().item() == pytest.approx(0.01, rel=1e-4)


def test_gradient_clipping_under_fp16_clips_the_unscaled_gradient(make_cfg):
    # With a live loss scaler the gradients stay multiplied by its scale (2^16 at the start) until
    # unscale_: the clip must come after it, so that the update is lr x clip as in fp32 (clipping
    # the scaled gradient leaves an update of lr x clip / 2^16 once the scaler's step unscales it).
    overrides = ["optimizer.momentum=0", "optimizer.weight_decay=0", "optimizer.lr=1.0", "trainer.max_steps=1"]
    cfg = make_cfg(*TINY, *overrides, "precision=fp16", "trainer.clip_grad_norm=0.01")
    loop = build_loop(cfg)
    assert loop.step.scaler.is_enabled() and loop.step.scaler.get_scale() == 2.0**16
    before = torch.cat([p.detach().flatten().clone() for p in loop.step.model.parameters()])
    train(loop, TrainState())
    after = torch.cat([p.detach().flatten() for p in loop.step.model.parameters()])
    assert (after - before).norm().item() == pytest.approx(0.01, rel=1e-4)


def test_clipping_acts_on_the_accumulated_gradient_of_the_whole_step(make_cfg):
    clip = ["trainer.clip_grad_norm=0.05", "trainer.max_steps=3"]
    big, _ = trained(make_cfg, "batch.size=32", *clip)
    accum, _ = trained(make_cfg, "batch=accumulation", "batch.size=32", "batch.micro_size=8", *clip)
    unclipped, _ = trained(make_cfg, "batch=accumulation", "batch.size=32", "batch.micro_size=8", "trainer.max_steps=3")
    assert_close(params(big), params(accum), atol=1e-6)  # clipped once, after the last micro-step
    moved = max((params(accum)[k] - v).abs().max() for k, v in params(unclipped).items())
    assert moved > 1e-3  # the clip did bind


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_reduced_precision_trains(make_cfg, precision):
    loop, progress = trained(make_cfg, f"precision={precision}", "epochs=3")
    with loop.step.autocast():
        logits = loop.step.model(loop.splits.val.x[:4])
    assert logits.dtype == {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    assert loop.step.scaler.is_enabled() == (precision == "fp16")  # loss scaling only for fp16
    losses = [r["train_loss"] for r in progress.records]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    assert progress.records[-1]["val_acc"] > 0.5  # ten classes: chance is 0.1


def test_a_warmup_longer_than_the_run_reports_the_lr_it_reached(make_cfg):
    # batch 512 at ref 128: target 0.4 from 0.1 over 8 steps, but the run stops after 4.
    cfg = make_cfg(
        *TINY,
        "data.num_samples=3160",
        "batch.size=512",
        "schedule.warmup_shape=linear",
        "schedule.unit=steps",
        "schedule.warmup=8",
        "trainer.max_steps=4",
    )
    loop = build_loop(cfg)
    assert loop.hp.lr == pytest.approx(0.4)
    assert loop.hp.lr_peak == pytest.approx(0.1 + 0.3 * 3 / 8)  # the LR of the last step taken


@pytest.mark.parametrize("rule", ["linear", "sqrt", "none"])
@pytest.mark.parametrize("shape", ["linear", "constant"])
def test_warmup_starts_at_the_reference_batchs_lr_under_every_rule(make_cfg, rule, shape):
    # Goyal et al. 2017 sec. 2.2: the warmup begins at the LR the reference batch uses (0.1 at 128),
    # whatever the rule makes of the target at batch 1024 (0.8 linear, 0.1 x sqrt 8 sqrt, 0.1 none).
    from bsexp.train.loop import build_loop

    cfg = make_cfg(
        "batch.size=1024",
        f"scaling.lr_rule={rule}",
        f"schedule.warmup_shape={shape}",
        "schedule.warmup=2",
        "trainer.progress=false",
    )
    loop = build_loop(cfg)
    target = {"linear": 0.8, "sqrt": 0.1 * math.sqrt(8), "none": 0.1}[rule]
    assert loop.hp.lr == pytest.approx(target)
    assert loop.step.optimizer.param_groups[0]["lr"] == pytest.approx(0.1)  # the first step's LR
    warmup = loop.hp.warmup_steps
    last_warmup_lr = loop.hp.lr * loop.hyperparameters.factors(warmup - 1)
    # The ramp is counted in samples: 2 epochs of 3,500, the last warmup step starting after 6,572.
    seen = loop.batch_control.layout.run.before[warmup - 1]
    assert (warmup, seen) == (8, 6572)
    assert last_warmup_lr == pytest.approx(0.1 if shape == "constant" else 0.1 + (target - 0.1) * seen / 7000)
    assert loop.hp.lr * loop.hyperparameters.factors(warmup) == pytest.approx(target)  # warmup reached the target


def test_ghost_batches_of_16_train_as_micro_batches_of_16_accumulated(make_cfg):
    # Hoffer et al.'s ghost BatchNorm: a batch of 64 normalised in four chunks of 16 computes what
    # four accumulated micro-batches of 16 compute (gradients, running statistics), and not what
    # BatchNorm over all 64 does.
    bn = ["model.norm=batch", "batch.size=64", "trainer.max_steps=4"]
    ghost, _ = trained(make_cfg, *bn, "model.ghost_batch=16")
    accum, _ = trained(make_cfg, *bn, "batch=accumulation", "batch.micro_size=16")
    whole, _ = trained(make_cfg, *bn)
    assert_close(params(ghost), params(accum), atol=1e-5)
    assert max((params(ghost)[k] - v).float().abs().max() for k, v in params(whole).items()) > 1e-3
    assert ghost.norm_batch == accum.norm_batch == 16 and whole.norm_batch == 64  # what a BatchNorm layer saw


def test_best_val_acc_is_the_best_of_the_runs_records(make_cfg):
    # An evaluation every step of a short run at a high LR: validation accuracy rises, then falls
    # back, so the last record is not the best.
    loop, progress = trained(make_cfg, "optimizer.lr=0.5", "trainer.max_steps=12", "trainer.eval_every_steps=1")
    accuracies = [r["val_acc"] for r in progress.records]
    assert len(accuracies) == 12 and accuracies[-1] < max(accuracies)
    assert progress.best_val_acc == max(accuracies)  # what summary.json's best_val_acc holds


def batchnorm_layers(net: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


def test_precise_bn_makes_the_running_statistics_the_mean_of_the_batch_statistics_over_its_samples(make_cfg):
    # trainer.precise_bn (Wu & Johnson's PreciseBN): before each evaluation every BatchNorm layer's
    # running mean and variance become the plain average, over 128 training samples drawn by the
    # seed and taken in batches of the micro-batch (4 of 32), of the mean and unbiased variance of
    # the layer's input there, with the weights as they are: computed here by hooks on a copy.
    bn = ["model.norm=batch", "model.hidden=[32,32]", "batch.size=32", "trainer.max_steps=5"]
    loop, _ = trained(make_cfg, *bn, "trainer.precise_bn=128", "seed=3")
    net = loop.step.net
    copy = deepcopy(net).train()
    seen: dict[int, list[torch.Tensor]] = {}
    for i, layer in enumerate(batchnorm_layers(copy)):
        layer.register_forward_hook(lambda m, args, out, i=i: seen.setdefault(i, []).append(args[0].detach()))
    train = loop.splits.train
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(3))[:128]
    with torch.no_grad():
        for part in order.split(32):
            copy(train.batch(part)[0])
    layers = batchnorm_layers(net)
    assert len(layers) == len(seen) == 2
    for i, layer in enumerate(layers):
        torch.testing.assert_close(layer.running_mean, torch.stack([x.mean(0) for x in seen[i]]).mean(0))
        torch.testing.assert_close(layer.running_var, torch.stack([x.var(0) for x in seen[i]]).mean(0))
        assert layer.momentum == 0.1  # restored: training goes on averaging as before
    # Without it the same weights carry the exponential average of training: other statistics.
    plain, _ = trained(make_cfg, *bn, "seed=3")
    weights = lambda lp: {k: v for k, v in params(lp).items() if "running" not in k and "num_batches" not in k}  # noqa: E731
    assert_close(weights(plain), weights(loop), atol=0)  # running statistics never move the training
    assert (batchnorm_layers(plain.step.net)[0].running_var - layers[0].running_var).abs().max() > 1e-3


def test_with_precise_bn_the_evaluation_no_longer_depends_on_batchnorms_momentum(make_cfg):
    # BatchNorm's momentum moves only its running statistics, never the training: two runs that
    # differ in it alone train the same weights. A momentum made 1/k as slow (scaling.bn_momentum_rule=
    # inverse, k = 32) leaves the statistics stale and the evaluation differs; recomputed, it does not.
    bn = ["model.norm=batch", "batch.size=32", "trainer.max_steps=6", "trainer.eval_every_steps=3"]
    slow = ["scaling.bn_momentum_rule=inverse", "scaling.ref_batch=1", "scaling.lr_rule=none", "scaling.wd_rule=none"]
    plain = ["scaling.lr_rule=none", "scaling.wd_rule=none"]
    records = {}
    for name, overrides in {"plain": plain, "slow": slow}.items():
        for precise in (False, True):
            extra = ["trainer.precise_bn=96"] if precise else []
            loop, progress = trained(make_cfg, *bn, *overrides, *extra)
            records[name, precise] = [(r["val_loss"], r["train_eval_loss"]) for r in progress.records]
            assert batchnorm_layers(loop.step.net)[0].momentum == pytest.approx(0.1 / 32 if name == "slow" else 0.1)
    assert records["plain", True] == records["slow", True]
    assert records["plain", False] != records["slow", False]
