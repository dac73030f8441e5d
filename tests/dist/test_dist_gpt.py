"""model=gpt on two ranks over gloo equals one process with the whole batch (LayerNorm normalises each
token alone: nothing couples the samples of a rank), and its sharded evaluation counts every
sequence once."""

import pytest
import torch

import dist_workers
from bsexp.train.loop import TrainState, build_loop, train

# The GPT of tests/loop/test_gpt.py, under SGD (whose step is proportional to the gradient).
TINY_GPT = [
    "model=gpt",
    "data=text",
    "data.context=12",
    "data.train_tokens=3072",
    "data.val_size=41",
    "model.width=32",
    "model.heads=2",
    "optimizer=sgd",
    "optimizer.lr=0.5",
    "optimizer.momentum=0",
    "batch.size=16",
    "trainer.max_steps=4",
    "trainer.progress=false",
    "trainer.threads=1",
    "schedule.warmup_shape=none",
    "schedule.main=constant",
]


@pytest.mark.slow  # two ranks started by torchrun's launcher: 20 s of CPU, 40 s on the shared 2 cores
def test_two_ranks_of_8_sequences_equal_one_process_of_16(make_cfg):
    loop = build_loop(make_cfg(*TINY_GPT))
    before = loop.evaluator.split(loop, loop.splits.val)
    progress = TrainState()
    assert train(loop, progress) == "completed"
    ranks = dist_workers.launch(
        dist_workers.train_steps, make_cfg(*TINY_GPT, "distributed=ddp", "distributed.nproc_per_node=2")
    )
    for rank in ranks.values():
        assert rank["world_size"] == 2 and rank["status"] == "completed" and rank["steps"] == 4
        for key, value in loop.step.net.state_dict().items():
            assert torch.allclose(rank["params"][key], value, atol=1e-5, rtol=0), key
    # 41 validation sequences, sharded 21 + 20: the one process's loss, to float32 rounding.
    assert ranks[0]["val_before"][0] == pytest.approx(before[0], rel=1e-6)
    assert ranks[0]["records"][-1]["tokens_seen"] == progress.records[-1]["tokens_seen"] == 4 * 16 * 12
