"""The gradient noise scale in training: against exact per-example gradients, with no extra
backward pass, unchanged runs, fp16 overflows, and its rise as training goes on."""

import math

import pytest
import torch
import torch.nn.functional as F

from bsexp.train.loop import TrainState, build_loop, train
from exact_noise import LOGISTIC, exact_noise

# The backward hooks that count backward passes see no input gradients (the data needs none).
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")


def test_steps_an_fp16_loss_scaler_skips_do_not_poison_the_noise_scale(make_cfg, caplog):
    # A loss scale of 2^50 overflows fp16 for real: the scaler skips those steps and halves the
    # scale each time; their gradients are not finite and must not enter the estimates.
    cfg = make_cfg(
        "batch=accumulation",
        "batch.size=128",
        "batch.micro_size=32",
        "precision=fp16",
        "epochs=2",
        "model.width=8",
        "trainer.progress=false",
        "trainer.eval_every_steps=10",
    )
    loop = build_loop(cfg)
    scaler = loop.step.scaler  # the run's own, its scale set to 2^50 through its public API
    scaler.scale(torch.ones(()))
    scaler.update(new_scale=2.0**50)
    progress = TrainState()
    with caplog.at_level("WARNING"):
        assert train(loop, progress) == "completed"
    skipped = round(math.log2(2.0**50 / loop.step.scaler.get_scale()))
    assert skipped > 10 and int(loop.step.noise.scale.skipped) == skipped
    assert loop.step.noise.scale.count == progress.step - skipped
    last = progress.records[-1]
    assert math.isfinite(last["noise/b_simple"]) and last["noise/b_simple"] > 0
    assert all(r.get("noise/b_simple") is None or math.isfinite(r["noise/b_simple"]) for r in progress.records)
    assert "non-finite gradients" in caplog.text


@pytest.mark.parametrize(
    "model",
    [
        ["model.width=8", "model.norm=batch"],
        ["model.width=8", "model.norm=group"],
        ["model.width=8", "model.norm=layer"],
        ["model.width=8", "model.norm=none"],
        ["model=mlp", "model.dropout=0.3"],
    ],
)
def test_measuring_always_does_not_change_the_run(make_cfg, model):
    # BatchNorm normalises over the whole batch, dropout draws from the generator: measuring on the
    # side must leave both as they were, so the run equals the run that does not measure.
    common = [
        "batch.size=64",
        "epochs=1",
        "trainer.max_steps=12",
        "trainer.progress=false",
        "trainer.eval_every_steps=6",
        *model,
    ]
    loops = {}
    for mode in ("off", "always"):
        cfg = make_cfg(*common, f"trainer.noise_scale={mode}")
        loops[mode] = build_loop(cfg)
        assert train(loops[mode], TrainState()) == "completed"
    assert loops["always"].step.noise.scale.count == 12 and loops["off"].step.noise is None
    off, always = loops["off"].step.net.state_dict(), loops["always"].step.net.state_dict()
    for key in off:
        assert torch.allclose(off[key].double(), always[key].double(), atol=1e-6, rtol=0), key


@pytest.mark.parametrize("norm", ["batch", "none"])
def test_the_half_measured_on_the_side_is_normalised_with_the_statistics_the_step_trains_on(make_cfg, norm):
    # With BatchNorm the half's gradient is taken through the whole batch's statistics (the
    # half's loss, the whole batch's forward): it changes when only the other half does. Without
    # BatchNorm the samples are independent and the other half cannot matter.
    loop = build_loop(
        make_cfg(
            "model.width=8",
            f"model.norm={norm}",
            "batch.size=64",
            "trainer.noise_scale=always",
            "trainer.progress=false",
        )
    )
    step, meter = loop.step, loop.step.noise
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 1, 40, generator=generator), torch.randint(10, (64,), generator=generator)
    other = torch.cat([x[:32], 3 * x[32:] + 1])
    params = [p for p in step.net.parameters() if p.requires_grad]
    found = []
    for inputs in (x, other):
        meter.begin(step, inputs, y, 1)
        small_sq, b_small = meter._small
        logits = step.net(inputs)[:32] if norm == "batch" else step.net(inputs[:32])
        by_hand = sum(g.double().pow(2).sum() for g in torch.autograd.grad(F.cross_entropy(logits, y[:32]), params))
        assert b_small == 32 and float(small_sq) == pytest.approx(float(by_hand), rel=1e-5)
        found.append(float(small_sq))
    assert (found[0] != pytest.approx(found[1], rel=1e-3)) == (norm == "batch")


def test_accumulation_measures_the_exact_noise_scale(make_cfg):
    cfg = make_cfg(*LOGISTIC, "batch=accumulation", "batch.size=64", "batch.micro_size=16")
    loop = build_loop(cfg)
    assert train(loop, TrainState()) == "completed"
    g2, tr = exact_noise(loop)
    found = loop.step.noise.scale.summary()
    assert found["noise_measurements"] == loop.batch_control.layout.run.total > 1000
    assert found["noise_grad_sq_mean"] == pytest.approx(g2, rel=0.1)
    assert found["noise_trace_sigma_mean"] == pytest.approx(tr, rel=0.1)
    assert found["noise_b_simple_mean"] == pytest.approx(tr / g2, rel=0.1)


@pytest.mark.parametrize(
    "measure",
    [["batch=accumulation", "batch.micro_size=8"], ["trainer.noise_scale=always"]],
    ids=["accumulation", "side-half"],
)
def test_the_noise_scale_of_a_small_training_set_is_corrected_for_drawing_without_replacement(make_cfg, measure):
    # 64 training samples, steps of 32: a step's mean gradient varies by tr(Sigma)(1/32 - 1/64),
    # half what independent draws give, so uncorrected the |G|^2 estimate falls short by
    # tr(Sigma)/64 (a quarter here) and B_simple reads 1/(1/B_simple - 1/64), 30 % high.
    small = [o for o in LOGISTIC if not o.startswith(("data.num_samples", "data.val_size", "epochs"))]
    loop = build_loop(
        make_cfg(*small, "data.num_samples=128", "data.val_size=64", "epochs=500", "batch.size=32", *measure)
    )
    assert train(loop, TrainState()) == "completed"
    g2, tr = exact_noise(loop)
    found = loop.step.noise.scale.summary()
    assert found["noise_population"] == len(loop.splits.train) == 64 and found["noise_measurements"] == 1000
    assert found["noise_trace_sigma_mean"] == pytest.approx(tr, rel=0.05)
    assert found["noise_grad_sq_mean"] == pytest.approx(g2, rel=0.05)
    assert found["noise_b_simple_mean"] == pytest.approx(tr / g2, rel=0.05)


def count_backwards(loop) -> list[int]:
    calls = [0]
    loop.step.net.register_full_backward_hook(lambda *args: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_measuring_adds_no_backward_pass(make_cfg, mode):
    cfg = make_cfg(
        *LOGISTIC,
        "epochs=1",
        "trainer.max_steps=5",
        "batch=accumulation",
        "batch.size=64",
        "batch.micro_size=16",
        f"trainer.noise_scale={mode}",
    )
    loop = build_loop(cfg)
    calls = count_backwards(loop)
    train(loop, TrainState())
    assert calls[0] == 5 * 4  # one per micro-step
    assert (loop.step.noise is not None and loop.step.noise.scale.count == 5) == (mode == "auto")


def test_always_measures_a_single_micro_batch_from_a_half_on_the_side_and_off_measures_nothing(make_cfg):
    always = make_cfg(*LOGISTIC, "epochs=1", "trainer.max_steps=5", "batch.size=64", "trainer.noise_scale=always")
    loop = build_loop(always)
    calls = count_backwards(loop)
    train(loop, TrainState())
    assert calls[0] == 10 and loop.step.noise.scale.count == 5  # a half on the side each step: the cost of measuring
    auto = make_cfg(*LOGISTIC, "epochs=1", "trainer.max_steps=5", "batch.size=64")
    loop = build_loop(auto)
    train(loop, TrainState())
    assert loop.step.noise.scale.count == 0  # auto: nothing to measure for free in one process, one micro-batch


def test_the_noise_scale_rises_as_the_training_loss_falls_on_mnist1d(make_cfg):
    cfg = make_cfg(
        "batch=accumulation",
        "batch.size=128",
        "batch.micro_size=32",
        "epochs=4",
        "trainer.progress=false",
        "trainer.noise_decay=0.9",
    )
    loop, progress = build_loop(cfg), TrainState()
    train(loop, progress)
    records = progress.records
    assert records[-1]["train_loss"] < records[0]["train_loss"] / 3
    assert records[-1]["noise/b_simple"] > 2 * records[0]["noise/b_simple"] > 0  # McCandlish et al. Fig. 4
