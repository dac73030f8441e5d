"""A diverging run is found whether the loop looks at its losses every step or every few."""


from bsexp.loop import TrainState, build_loop, train

# About 10 ms a step on one thread, 180 steps: long enough to stop at a random step mid-epoch.
SLOW = ["data=synthetic", "data.shape=[1,128]", "data.num_samples=4000", "data.val_size=200", "model=mlp",
        "model.norm=none", "model.hidden=[1024,1024]", "epochs=3", "trainer.threads=1", "checkpoint.every_steps=7",
        "checkpoint.keep=3", "logger=none", "trainer.progress=false"]
POLICIES = {
    "fixed": ["batch.size=64"],
    "accumulation": ["batch=accumulation", "batch.size=64", "batch.micro_size=16"],
    "scheduled": ["batch=scheduled", "batch.size=64", "batch.schedule.milestones=[1]", "batch.schedule.factor=2"],
}


DIVERGES = ["data=synthetic", "data.shape=[1,16]", "data.num_samples=1000", "data.val_size=100", "model=mlp",
            "model.norm=none", "optimizer.lr=1e6", "schedule.warmup_shape=none", "trainer.progress=false"]


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
