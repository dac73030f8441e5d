"""model.activation_checkpointing=true: the same training, in less memory (a real cap decides)."""

import subprocess
import sys

import pytest
import torch
from torch import nn

from bsexp.engine.models import Checkpointed, checkpoint_blocks
from bsexp.train.loop import TrainState, build_loop, train
from conftest import HELPERS, cli_env

SMALL = [
    "data=synthetic",
    "data.shape=[3,16,16]",
    "data.num_samples=300",
    "data.val_size=44",
    "batch.size=64",
    "trainer.progress=false",
    "trainer.max_steps=3",
]


def trained(make_cfg, *overrides):
    loop = build_loop(make_cfg(*overrides))
    assert train(loop, TrainState()) == "completed"
    return loop


@pytest.mark.parametrize(
    "model",
    [
        ["model=cnn", "model.width=8"],
        ["model=mlp", "model.hidden=[32,32]", "model.dropout=0.2"],
        pytest.param(["model=resnet18"], marks=pytest.mark.slow),
    ],
)
def test_a_checkpointed_run_trains_exactly_as_the_plain_run(make_cfg, model):
    # BatchNorm's running statistics (buffers) too: the recomputation must not update them twice;
    # dropout's masks too: the recomputation replays the random generator.
    plain = trained(make_cfg, *SMALL, *model)
    checkpointed = trained(make_cfg, *SMALL, *model, "model.activation_checkpointing=true")
    blocks = [m for m in checkpointed.step.model.modules() if isinstance(m, Checkpointed)]
    assert blocks and not any(isinstance(m, Checkpointed) for m in plain.step.model.modules())
    a, b = plain.step.model.state_dict().values(), checkpointed.step.model.state_dict().values()
    assert len(a) == len(b)
    start = build_loop(make_cfg(*SMALL, *model)).step.model.state_dict().values()
    assert max((x.float() - s.float()).abs().max() for x, s in zip(a, start)) > 1e-3  # training moved them
    for x, y in zip(a, b):
        assert torch.allclose(x.float(), y.float(), atol=1e-6, rtol=0)


def test_any_sequential_is_checkpointed_in_segments_and_other_models_are_refused():
    seq = checkpoint_blocks(nn.Sequential(*[nn.Linear(4, 4) for _ in range(9)]))
    assert [len(block.block) for block in seq] == [3, 3, 3]
    with pytest.raises(ValueError, match="neither a built-in model nor an nn.Sequential"):
        checkpoint_blocks(nn.Linear(4, 4))


def capped(tmp_path, name, room_mb, *overrides):
    out = tmp_path / f"{name}.pt"
    done = subprocess.run(
        [sys.executable, str(HELPERS / "capped_train.py"), str(out), str(room_mb), *overrides],
        capture_output=True,
        text=True,
        timeout=300,
        env=cli_env(tmp_path),
    )
    return done.returncode, done.stderr


def test_checkpointing_fits_a_batch_the_plain_run_cannot_under_the_same_cap(tmp_path):
    # A batch of 512 on 3x32x32 in a conv net needs about 290 MB above what the process holds
    # without checkpointing, about 210 MB with it: 250 MB more than the process holds decides.
    shape = [
        "data=synthetic",
        "data.shape=[3,32,32]",
        "data.num_samples=1200",
        "data.val_size=100",
        "model=cnn",
        "model.width=16",
        "batch.size=512",
        "epochs=1",
        "trainer.oom_recovery=false",
    ]
    code, err = capped(tmp_path, "plain", 250, *shape)
    assert code == 1 and "can't allocate memory" in err
    code, err = capped(tmp_path, "checkpointed", 250, *shape, "model.activation_checkpointing=true")
    assert code == 0, err[-2000:]
    assert torch.load(tmp_path / "checkpointed.pt", weights_only=False)["status"] == "completed"
