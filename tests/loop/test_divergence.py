"""A diverging run is found whether the loop looks at its losses every step or every few."""

from bsexp.train.loop import TrainState, build_loop, train

DIVERGES = [
    "data=synthetic",
    "data.shape=[1,16]",
    "data.num_samples=1000",
    "data.val_size=100",
    "model=mlp",
    "model.norm=none",
    "optimizer.lr=1e6",
    "schedule.warmup_shape=none",
    "trainer.progress=false",
]


def test_looking_at_the_losses_every_few_steps_finds_the_same_divergence(make_cfg):
    # On a GPU the loop looks at the losses every 16 steps, not to stall the device each step.
    found = []
    for every in (1, 8):
        cfg = make_cfg(*DIVERGES)
        loop, progress = build_loop(cfg), TrainState()
        loop.watch.every = every
        assert train(loop, progress) == "diverged"
        found.append((progress.diverged_at_step, progress.last_finite_loss))
    assert found[0] == found[1] and found[0][0] > 1
