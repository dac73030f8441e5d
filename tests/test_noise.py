"""The gradient noise scale: against exact per-example gradients, over two ranks, with no extra
backward pass, and its rise as training goes on."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

import dist_workers
from bsexp.config import check
from bsexp.noise import NoiseScale, estimates
from bsexp.report import fit_critical_batch
from bsexp.run import build_loop
from bsexp.trainer import Progress, train

# The backward hooks that count backward passes see no input gradients (the data needs none).
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")

# Logistic regression (no hidden layer) on overlapping Gaussian classes, with an LR so small that
# the parameters stay put: the exact |G|^2 and tr(Sigma) at those parameters are the target.
LOGISTIC = ["data=synthetic", "data.shape=[1,8]", "data.num_classes=4", "data.noise=3.0", "data.num_samples=8100",
            "data.val_size=100", "model=mlp", "model.hidden=[]", "optimizer.lr=1e-9", "optimizer.weight_decay=0",
            "optimizer.momentum=0", "schedule.warmup_shape=none", "schedule.main=constant", "trainer.progress=false",
            "trainer.eval_every_steps=1000", "epochs=10"]


def exact_noise(loop) -> tuple[float, float]:
    """|G|^2 and tr(Sigma) from every training sample's own gradient (torch.func)."""
    net = loop.net
    params = {k: v.detach() for k, v in net.named_parameters()}
    x, y = loop.splits.train.x, loop.splits.train.y

    def loss(p, xi, yi):
        return F.cross_entropy(functional_call(net, p, (xi[None],)), yi[None])

    per_example = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    flat = torch.cat([g.reshape(len(x), -1) for g in per_example.values()], dim=1).double()
    mean = flat.mean(0)
    return mean.pow(2).sum().item(), (flat - mean).pow(2).sum(1).mean().item()


def test_the_estimates_are_unbiased_on_known_moments():
    # |G_B|^2 has expectation |G|^2 + tr(Sigma) / B: feed exact expectations, get exact answers back.
    g2, tr = 2.0, 300.0
    grad_sq, trace = estimates(g2 + tr / 16, 16, g2 + tr / 64, 64)
    assert grad_sq == pytest.approx(g2) and trace == pytest.approx(tr)
    noise = NoiseScale(decay=0.9)
    for _ in range(5):
        noise.update(torch.tensor(g2 + tr / 16), 16, torch.tensor(g2 + tr / 64), 64)
    assert noise.record()["noise/b_simple"] == pytest.approx(tr / g2)  # bias-corrected moving averages
    assert noise.summary()["noise_b_simple_mean"] == pytest.approx(tr / g2)


def test_a_measurement_that_is_not_finite_is_left_out_and_the_next_ones_count():
    g2, tr = 2.0, 300.0
    clean, hit = NoiseScale(decay=0.9), NoiseScale(decay=0.9)
    for step in range(6):
        small, big = torch.tensor(g2 + tr / 16), torch.tensor(g2 + tr / 64)
        clean.update(small, 16, big, 64)
        if step == 2:  # an fp16 overflow: inf in one norm, nan in the other
            hit.update(torch.tensor(float("inf")), 16, torch.tensor(float("nan")), 64)
        hit.update(small, 16, big, 64)
    assert hit.count == clean.count == 6 and int(hit.skipped) == 1
    assert hit.record()["noise/b_simple"] == pytest.approx(clean.record()["noise/b_simple"]) == pytest.approx(tr / g2)
    assert hit.summary()["noise_b_simple_mean"] == pytest.approx(tr / g2)
    assert hit.summary()["noise_skipped"] == 1


def test_steps_an_fp16_loss_scaler_skips_do_not_poison_the_noise_scale(make_cfg, caplog):
    # A loss scale of 2^50 overflows fp16 for real: the scaler skips those steps and halves the
    # scale each time; their gradients are not finite and must not enter the estimates.
    cfg = make_cfg("batch=accumulation", "batch.size=128", "batch.micro_size=32", "precision=fp16", "epochs=2",
                   "model.width=8", "trainer.progress=false", "trainer.eval_every_steps=10")
    loop = build_loop(cfg, check(cfg))
    loop.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**50)
    progress = Progress()
    with caplog.at_level("WARNING"):
        assert train(loop, progress) == "completed"
    skipped = round(math.log2(2.0**50 / loop.scaler.get_scale()))
    assert skipped > 10 and int(loop.noise.skipped) == skipped
    assert loop.noise.count == progress.step - skipped
    last = progress.records[-1]
    assert math.isfinite(last["noise/b_simple"]) and last["noise/b_simple"] > 0
    assert all(r.get("noise/b_simple") is None or math.isfinite(r["noise/b_simple"]) for r in progress.records)
    assert "non-finite gradients" in caplog.text


@pytest.mark.parametrize("model", [["model.width=8", "model.norm=batch"], ["model.width=8", "model.norm=group"], ["model.width=8", "model.norm=layer"],
                                   ["model.width=8", "model.norm=none"], ["model=mlp", "model.dropout=0.3"]])
def test_measuring_always_does_not_change_the_run(make_cfg, model):
    # BatchNorm normalises over the whole batch, dropout draws from the generator: measuring on the
    # side must leave both as they were, so the run equals the run that does not measure.
    common = ["batch.size=64", "epochs=1", "trainer.max_steps=12", "trainer.progress=false",
              "trainer.eval_every_steps=6", *model]
    loops = {}
    for mode in ("off", "always"):
        cfg = make_cfg(*common, f"trainer.noise_scale={mode}")
        loops[mode] = build_loop(cfg, check(cfg))
        assert train(loops[mode], Progress()) == "completed"
    assert loops["always"].noise.count == 12 and loops["off"].noise is None
    off, always = loops["off"].net.state_dict(), loops["always"].net.state_dict()
    for key in off:
        assert torch.allclose(off[key].double(), always[key].double(), atol=1e-6, rtol=0), key


def test_accumulation_measures_the_exact_noise_scale(make_cfg):
    cfg = make_cfg(*LOGISTIC, "batch=accumulation", "batch.size=64", "batch.micro_size=16")
    loop = build_loop(cfg, check(cfg))
    assert train(loop, Progress()) == "completed"
    g2, tr = exact_noise(loop)
    found = loop.noise.summary()
    assert found["noise_measurements"] == loop.run_steps.total > 1000
    assert found["noise_grad_sq_mean"] == pytest.approx(g2, rel=0.1)
    assert found["noise_trace_sigma_mean"] == pytest.approx(tr, rel=0.1)
    assert found["noise_b_simple_mean"] == pytest.approx(tr / g2, rel=0.1)


def test_two_ranks_measure_it_from_each_ranks_gradient_before_the_all_reduce(make_cfg):
    cfg = make_cfg(*LOGISTIC, "batch.size=64", "distributed=ddp", "distributed.nproc_per_node=2",
                   "trainer.oom_recovery=false")  # one micro-batch a rank: DDP's communication hook sees it
    ranks = dist_workers.launch(dist_workers.train_steps, cfg)
    single = make_cfg(*LOGISTIC, "batch.size=64")
    loop = build_loop(single, check(single))
    g2, tr = exact_noise(loop)
    found = ranks[0]["noise"]
    assert found["noise_measurements"] == ranks[0]["steps"] > 1000
    assert found["noise_grad_sq_mean"] == pytest.approx(g2, rel=0.1)
    assert found["noise_trace_sigma_mean"] == pytest.approx(tr, rel=0.1)
    assert found["noise_b_simple_mean"] == pytest.approx(tr / g2, rel=0.1)
    assert ranks[1]["noise"]["noise_b_simple_mean"] == pytest.approx(found["noise_b_simple_mean"])


def count_backwards(loop) -> list[int]:
    calls = [0]
    loop.net.register_full_backward_hook(lambda *args: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_measuring_adds_no_backward_pass(make_cfg, mode):
    cfg = make_cfg(*LOGISTIC, "epochs=1", "trainer.max_steps=5", "batch=accumulation", "batch.size=64",
                   "batch.micro_size=16", f"trainer.noise_scale={mode}")
    loop = build_loop(cfg, check(cfg))
    calls = count_backwards(loop)
    train(loop, Progress())
    assert calls[0] == 5 * 4  # one per micro-step
    assert (loop.noise is not None and loop.noise.count == 5) == (mode == "auto")


def test_measuring_over_two_ranks_adds_no_backward_pass(make_cfg):
    cfg = make_cfg(*LOGISTIC, "epochs=1", "trainer.max_steps=5", "batch.size=64", "distributed=ddp",
                   "distributed.nproc_per_node=2")
    ranks = dist_workers.launch(dist_workers.train_steps, cfg)
    assert [r["backwards"] for r in ranks.values()] == [5, 5]
    assert ranks[0]["noise"]["noise_measurements"] == 5


def test_always_measures_a_single_micro_batch_from_a_half_on_the_side_and_off_measures_nothing(make_cfg):
    always = make_cfg(*LOGISTIC, "epochs=1", "trainer.max_steps=5", "batch.size=64", "trainer.noise_scale=always")
    loop = build_loop(always, check(always))
    calls = count_backwards(loop)
    train(loop, Progress())
    assert calls[0] == 10 and loop.noise.count == 5  # a half on the side each step: the cost of measuring
    auto = make_cfg(*LOGISTIC, "epochs=1", "trainer.max_steps=5", "batch.size=64")
    loop = build_loop(auto, check(auto))
    train(loop, Progress())
    assert loop.noise.count == 0  # auto: nothing to measure for free in one process, one micro-batch


def test_the_noise_scale_rises_as_the_training_loss_falls_on_mnist1d(make_cfg):
    cfg = make_cfg("batch=accumulation", "batch.size=128", "batch.micro_size=32", "epochs=4", "trainer.progress=false",
                   "trainer.noise_decay=0.9")
    loop, progress = build_loop(cfg, check(cfg)), Progress()
    train(loop, progress)
    records = progress.records
    assert records[-1]["train_loss"] < records[0]["train_loss"] / 3
    assert records[-1]["noise/b_simple"] > 2 * records[0]["noise/b_simple"] > 0  # McCandlish et al. Fig. 4


def test_the_fit_recovers_the_critical_batch_from_steps_the_model_generates():
    import random

    rng = random.Random(0)
    s_min, b_crit = 120.0, 300.0
    batches = [32, 64, 128, 256, 512, 1024, 2048]
    # (S/S_min - 1)(E/E_min - 1) = 1 with E = B S  <=>  S = S_min (1 + B_crit / B); 3 % noise on each.
    steps = [s_min * (1 + b_crit / b) * (1 + rng.uniform(-0.03, 0.03)) for b in batches]
    fitted_s_min, fitted_e_min, fitted_b_crit = fit_critical_batch(batches, steps)
    assert fitted_b_crit == pytest.approx(b_crit, rel=0.1) and fitted_s_min == pytest.approx(s_min, rel=0.1)
    assert fitted_e_min == pytest.approx(s_min * b_crit, rel=0.1)
    assert fit_critical_batch([64, 64], [10, 11]) is None  # one batch size: nothing to fit


def test_the_finder_trains_at_the_batch_nearest_the_measured_noise_scale(run_cli, tmp_path):
    common = ["data=digits", "model=mlp", "epochs=2", "logger=none", "trainer.progress=false"]
    out = run_cli(*common, "batch=finder", "batch.finder.objective=noise_scale", "batch.finder.noise_steps=60",
                  "batch.finder.max_size=400", f"hydra.run.dir={tmp_path / 'found'}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "found" / "summary.json").read_text())
    measured, fits = summary["finder"]["noise_b_simple"], summary["finder"]["micro_size"]
    size = summary["batch_size"]
    assert measured > 0 and size == min(max(round(measured), 2), fits)
    assert f"training at batch {size}" in out.stdout
    # Measuring left no trace: the run is the fixed run at that batch.
    fixed = run_cli(*common, f"batch.size={size}", f"hydra.run.dir={tmp_path / 'fixed'}")
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    again = json.loads((tmp_path / "fixed" / "summary.json").read_text())
    assert (again["train_loss"], again["val_acc"], again["steps"]) == (summary["train_loss"], summary["val_acc"],
                                                                       summary["steps"])
