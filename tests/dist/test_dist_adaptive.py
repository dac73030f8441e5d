"""batch=adaptive on two ranks: rank 0's decision for both, every batch divisible over them."""

import torch

import dist_workers


def test_two_ranks_agree_on_every_change_of_the_adaptive_batch(make_cfg):
    cfg = make_cfg("data=synthetic", "data.shape=[1,16]", "data.num_samples=1700", "data.val_size=100",
                   "model=mlp", "model.hidden=[32]", "distributed=ddp", "batch=adaptive", "batch.size=16",
                   "batch.find_micro_size=false", "batch.adaptive.interval=5", "batch.adaptive.c=4",
                   "batch.adaptive.max_growth=1.5", "epochs=2", "trainer.progress=false")
    results = dist_workers.launch(dist_workers.train_adaptive, cfg)
    zero, one = results[0], results[1]
    assert zero["status"] == one["status"] == "completed"
    assert zero["points"] == one["points"] and len(zero["points"]) > 2  # the batch changed, on both alike
    assert zero["sizes"] == one["sizes"] and all(size % 2 == 0 for size in zero["sizes"])
    # Rank 0 decides and every rank takes its whole decision (B_simple, target, size, gain): rank 1
    # computes none of its own, so without the broadcast it would have no batch to change to.
    assert zero["decisions"] == one["decisions"] and len(zero["decisions"]) > 2
    for key, value in zero["params"].items():  # one model on both ranks
        assert torch.equal(value, one["params"][key]), key
