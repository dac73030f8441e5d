"""trainer.speed and trainer.compile_mode resolved for a device (bsexp.system.runtime.speed_for): the fast
path eager unless a compile mode is asked for; and the modes that record CUDA graphs refused with
the config (bsexp.config.checks), before anything is built."""

import pytest
import torch

from bsexp.config.checks import COMPILE_MODES, check_compile_mode
from bsexp.errors import ConfigError
from bsexp.system.runtime import speed_for

CUDA, CPU = torch.device("cuda", 0), torch.device("cpu")


@pytest.mark.parametrize(
    "choice, device, mode, fast, compiled",
    [
        ("auto", CUDA, None, True, None),  # fast on CUDA, eager by default
        ("auto", CPU, None, False, None),  # reproducible on the CPU
        ("fast", CPU, None, True, None),
        ("fast", CUDA, "none", True, None),
        ("fast", CUDA, "default", True, "default"),
        ("auto", CUDA, "max-autotune-no-cudagraphs", True, "max-autotune-no-cudagraphs"),
        ("reproducible", CUDA, "default", False, None),  # the reproducible path never compiles
    ],
)
def test_the_fast_path_compiles_only_when_a_mode_asks(choice, device, mode, fast, compiled):
    speed = speed_for(choice, device, images=True, compile_mode=mode)
    assert speed.fast == fast and speed.compile == compiled
    assert speed.channels_last == fast and speed.fused_optimizer == fast


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_the_modes_that_record_cuda_graphs_are_refused_with_the_reason(mode):
    with pytest.raises(ConfigError) as refused:
        check_compile_mode(mode)
    assert refused.value.key == "trainer.compile_mode" and "pytorch/pytorch#169545" in str(refused.value)
    assert all(valid in str(refused.value) for valid in COMPILE_MODES)


def test_an_unknown_mode_is_refused_whatever_the_path_and_null_means_eager():
    with pytest.raises(ConfigError, match="valid: none, default, max-autotune-no-cudagraphs"):
        check_compile_mode("fastest")
    for mode in (None, *COMPILE_MODES):
        check_compile_mode(mode)


def test_cudnns_autotuner_is_on_only_for_models_that_convolve_images_and_only_on_the_fast_path():
    # It times every algorithm for each new shape: worth it for ResNet-18's convolutions, not for the
    # default run's 1-D convolutions (1.1 s of its 4.5 s on an H200, and 1 GB of workspace).
    assert speed_for("auto", CUDA, images=True).cudnn_benchmark
    assert speed_for("auto", CUDA, images=True).summary()["cudnn_benchmark"]
    assert not speed_for("auto", CUDA, images=False).cudnn_benchmark
    assert not speed_for("reproducible", CUDA, images=True).cudnn_benchmark
    assert not speed_for("fast", CPU, images=True).summary()["cudnn_benchmark"]  # no cuDNN on the CPU
