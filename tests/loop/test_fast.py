"""The fast path (trainer.speed=fast) on the CPU: fused optimizer kernels, no deterministic
algorithms, and torch.compile (inductor) when trainer.compile_mode asks for it. It trains as the
reproducible path does, within rounding, compiles one graph however the micro-batch changes, and
checkpoints and resumes."""

import pytest
import torch

from bsexp.system.runtime import compiled_graphs
from bsexp.train.loop import TrainState, build_loop, train

# The batch doubles every epoch (32, 64, 128), and an epoch ends in a shorter step: four shapes.
GROWING = [
    "data=synthetic",
    "data.shape=[1,16]",
    "data.num_samples=2000",
    "data.val_size=200",
    "model=mlp",
    "model.hidden=[32]",
    "epochs=3",
    "batch=scheduled",
    "batch.size=32",
    "batch.schedule.milestones=[1,2]",
    "batch.schedule.factor=2",
    "trainer.progress=false",
    "trainer.threads=1",
]


def trained(make_cfg, *overrides):
    threads = torch.get_num_threads()
    try:
        loop, state = build_loop(make_cfg(*GROWING, *overrides)), TrainState()
        assert train(loop, state) == "completed"
        return loop, state
    finally:
        torch.set_num_threads(threads)


def test_the_fast_path_trains_as_the_reproducible_one_and_compiles_once_as_the_batch_changes(make_cfg):
    slow, slow_state = trained(make_cfg, "trainer.speed=reproducible")
    fast, fast_state = trained(make_cfg, "trainer.speed=fast", "trainer.compile_mode=default")
    assert hasattr(fast.step.model, "_orig_mod") and not hasattr(slow.step.model, "_orig_mod")  # compiled
    assert fast.step.optimizer.defaults.get("fused") is True and not slow.step.optimizer.defaults.get("fused")
    taken = set(fast.batch_control.layout.run.taken)
    assert len(taken) >= 4  # 32, 64, 128 and a shorter last step
    # One graph for them all: the batch dimension is marked dynamic (no recompile per shape).
    assert compiled_graphs() - fast.graphs_before == 1
    # The same steps on the same samples; inductor fuses and reorders the float operations and the
    # fused SGD updates in another order: rounding apart, about 1e-7 of the loss here.
    assert [r["step"] for r in fast_state.records] == [r["step"] for r in slow_state.records]
    for mine, theirs in zip(fast_state.records, slow_state.records):
        assert mine["val_loss"] == pytest.approx(theirs["val_loss"], rel=1e-4)
        assert mine["val_acc"] == pytest.approx(theirs["val_acc"], abs=1 / 200 + 1e-9)


def test_the_fast_path_is_eager_unless_a_compile_mode_is_asked_for_and_trains_as_the_reproducible_one(make_cfg):
    slow, slow_state = trained(make_cfg, "trainer.speed=reproducible")
    fast, fast_state = trained(make_cfg, "trainer.speed=fast")
    assert not hasattr(fast.step.model, "_orig_mod") and fast.step.optimizer.defaults.get("fused") is True
    assert compiled_graphs() == fast.graphs_before  # nothing compiled
    assert not torch.are_deterministic_algorithms_enabled()
    # cuDNN's autotuner only for a model that convolves images (bsexp.system.runtime.Speed): not this MLP.
    assert not torch.backends.cudnn.benchmark and not fast.step.channels_last
    # The fused SGD updates in another order: rounding apart.
    for mine, theirs in zip(fast_state.records, slow_state.records, strict=True):
        assert mine["val_loss"] == pytest.approx(theirs["val_loss"], rel=1e-4)


def test_the_reproducible_path_is_the_cpus_default_and_leaves_no_fast_flag_behind(make_cfg):
    trained(make_cfg, "trainer.speed=fast", "trainer.compile_mode=default")
    loop = build_loop(make_cfg(*GROWING))  # trainer.speed=auto on the CPU
    assert not hasattr(loop.step.model, "_orig_mod")
    assert torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.benchmark
    assert not torch.backends.cuda.matmul.allow_tf32
