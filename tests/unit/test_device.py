"""The device a rank trains on, resolved once with its index, and a GPU of its own for every rank
of a node: checked with the number of GPUs given, so that it runs on a machine without one."""

import pytest
import torch

from bsexp.config.checks import check, check_gpus
from bsexp.errors import ConfigError
from bsexp.system.runtime import resolve_device


@pytest.mark.parametrize(
    "choice, local_rank, gpus, device",
    [
        ("auto", 0, 0, "cpu"),
        ("cpu", 0, 4, "cpu"),
        ("cpu", 3, 0, "cpu"),
        ("auto", 0, 1, "cuda:0"),
        ("cuda", 0, 1, "cuda:0"),
        ("auto", 2, 4, "cuda:2"),
        ("cuda", 3, 4, "cuda:3"),
    ],
)
def test_a_gpu_always_comes_with_its_index(choice, local_rank, gpus, device):
    resolved = resolve_device(choice, local_rank, cuda_devices=gpus)
    assert resolved == torch.device(device)
    # torch.cuda.set_per_process_memory_fraction and its memory statistics refuse a bare "cuda".
    assert resolved.type == "cpu" or resolved.index == local_rank


def test_cuda_without_a_gpu_names_the_key_and_what_is_valid():
    with pytest.raises(ConfigError) as info:
        resolve_device("cuda", cuda_devices=0)
    assert str(info.value) == "device=cuda: CUDA is not available here; valid: auto, cpu"


def test_a_local_rank_beyond_the_gpus_is_refused_not_given_a_gpu_that_does_not_exist():
    with pytest.raises(ConfigError) as info:
        resolve_device("auto", local_rank=1, cuda_devices=1)
    assert info.value.key == "device" and "local rank 1 has no GPU of its own (1 GPU visible)" in str(info.value)


@pytest.mark.parametrize("device", ["auto", "cuda"])
def test_more_self_launched_ranks_than_gpus_is_one_line_before_any_worker_starts(make_cfg, device):
    cfg = make_cfg("distributed=ddp", "distributed.nproc_per_node=3", f"device={device}")
    with pytest.raises(ConfigError) as info:
        check_gpus(cfg, count=2)
    assert str(info.value) == (
        "distributed.nproc_per_node=3: 2 GPUs visible and each rank needs its own; valid: at "
        "most 2, or device=cpu to run the ranks on the CPU"
    )
    check_gpus(cfg, count=3)  # one each: fine
    check_gpus(make_cfg("distributed=ddp", "distributed.nproc_per_node=3", "device=cpu"), count=2)


def test_torchruns_ranks_on_a_node_are_counted_against_its_gpus(make_cfg, monkeypatch):
    for name, value in dict(
        TORCHELASTIC_RUN_ID="x", RANK="0", LOCAL_RANK="0", WORLD_SIZE="4", LOCAL_WORLD_SIZE="2"
    ).items():
        monkeypatch.setenv(name, value)
    cfg = make_cfg("distributed=ddp")
    with pytest.raises(ConfigError) as info:
        check_gpus(cfg, count=1)
    assert str(info.value).startswith("--nproc_per_node (torchrun)=2: 1 GPU visible and each rank needs its own")
    check_gpus(cfg, count=2)
    check_gpus(cfg, count=0)  # device=auto with no GPU: the ranks run on the CPU


def test_device_cuda_on_a_machine_without_one_is_refused_by_the_checks(make_cfg):
    with pytest.raises(ConfigError) as info:
        check_gpus(make_cfg("device=cuda"), count=0)
    assert info.value.key == "device"


@pytest.mark.parametrize("ranks", ["1", "2"])
def test_nccl_where_the_run_trains_on_the_cpu_is_refused_and_taken_with_gpus(make_cfg, ranks):
    nccl = ["distributed=ddp", f"distributed.nproc_per_node={ranks}", "distributed.backend=nccl"]
    for device, count in (("device=cpu", 2), ("device=auto", 0), ("device=cpu", 0)):
        with pytest.raises(ConfigError, match="NCCL needs CUDA GPUs") as refused:
            check_gpus(make_cfg(*nccl, device), count=count)
        assert refused.value.key == "distributed.backend"
    check_gpus(make_cfg(*nccl), count=2)  # device=auto with a GPU a rank: CUDA
    check_gpus(make_cfg("distributed.backend=nccl", "device=cpu"), count=0)  # one process: no process group


def test_ranks_asked_for_without_distributed_ddp_are_refused_not_ignored(make_cfg):
    with pytest.raises(ConfigError, match="with distributed=ddp only") as refused:
        check(make_cfg("distributed.nproc_per_node=2"))
    assert refused.value.key == "distributed.nproc_per_node" and refused.value.value == 2
