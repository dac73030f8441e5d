"""The graphed step's pure parts (bsexp.engine.cuda_graphs): which steps get a graph and under which
key, the bounded cache of graphs, and where trainer.cuda_graphs applies; and the pieces around it
that change no figure: one cast in the noise meter's norm, the loss scale read on the device, one
evaluation shape per split, the CPU's epoch order as it always was."""

import pytest
import torch

from bsexp.batch.plan import make_plan
from bsexp.engine.cuda_graphs import GraphCache, graph_key, graph_mode
from bsexp.engine.datasets import TensorSplit
from bsexp.engine.feed import PAD_LABEL, epoch_order, eval_batches, one_shape_size
from bsexp.engine.gradient_noise import loss_scale, squared_norm
from bsexp.engine.optim import graph_ready
from bsexp.errors import ConfigError

CUDA, CPU = torch.device("cuda", 0), torch.device("cpu")
PLAN = make_plan(128, micro_size=32)  # 4 micro-batches of 32
BASE = dict(rows=True, weight_decays=(5e-4, 0.0), dropouts=(0.1,), momenta=(0.1,))


def test_a_full_step_has_a_key_an_epochs_short_last_step_and_a_side_measurement_have_none():
    key = graph_key([32] * 4, 128, PLAN, **BASE)
    assert key is not None and key.sizes == (32, 32, 32, 32) and key.step_samples == 128
    assert graph_key([25, 25, 25, 25], 100, PLAN, **BASE) is None  # the epoch's last, shorter step
    one = make_plan(128)
    assert graph_key([128], 128, one, **BASE, side_measurement=True) is None  # noise_scale=always's own backward
    assert graph_key([32] * 4, 128, PLAN, **BASE, side_measurement=True) is not None  # measured free: the first micro
    assert graph_key([32] * 4, 128, PLAN, **{**BASE, "momenta": (None,)}) is None  # BatchNorm's cumulative average


@pytest.mark.parametrize(
    "change",
    [
        {"weight_decays": (1e-3, 0.0)},  # the batch moved the weight decay
        {"dropouts": (0.2,)},  # scaling.dropout_rule
        {"momenta": (0.05,)},  # scaling.bn_momentum_rule
        {"rows": False},  # static inputs copied in, not gathered inside
    ],
)
def test_every_constant_a_graph_reads_is_in_its_key(change):
    assert graph_key([32] * 4, 128, PLAN, **BASE) != graph_key([32] * 4, 128, PLAN, **{**BASE, **change})


def test_the_micro_batches_are_in_the_key():
    halved = make_plan(128, micro_size=16)  # after an out-of-memory halving
    assert graph_key([32] * 4, 128, PLAN, **BASE) != graph_key([16] * 8, 128, halved, **BASE)
    assert graph_key([32] * 4, 128, PLAN, **BASE) == graph_key([32] * 4, 128, PLAN, **BASE)  # hashable, equal


def test_the_cache_drops_the_least_recently_used_and_counts_warmups_of_keys_it_does_not_hold():
    cache = GraphCache(capacity=2)
    assert [cache.warmed("a", 2) for _ in range(3)] == [False, False, True]  # captured at the third sight
    assert cache.put("a", 1) == [] and cache.put("b", 2) == []
    assert cache.get("a") == 1  # a is now the most recent
    assert cache.put("c", 3) == [2] and cache.evicted == 1  # b dropped, not a
    assert cache.get("b") is None and len(cache) == 2
    assert cache.warmed("b", 2) is False  # a dropped key warms up again before its next capture
    cache.drop("a")
    assert cache.get("a") is None and cache.get("c") == 3
    cache.clear()
    assert len(cache) == 0 and cache.warmed("c", 1) is False


def test_the_warmup_counts_are_bounded_like_the_graphs():
    cache = GraphCache(capacity=2)
    for key in range(100):  # batch=adaptive: a new batch at every decision
        cache.warmed(key, 2)
    assert len(cache.seen) == 8 and list(cache.seen) == list(range(92, 100))


@pytest.mark.parametrize(
    "device, fused, precision, distributed, mode",
    [
        (CUDA, True, "bf16", False, "capture"),
        (CUDA, True, "fp32", False, "capture"),
        (CUDA, True, "fp16", False, "off"),  # the scaler's overflow check is read on the host
        (CUDA, True, "bf16", True, "off"),  # DDP stays eager
        (CUDA, False, "bf16", False, "off"),  # the reproducible path, or an optimizer without a fused update
        (CPU, True, "fp32", False, "off"),
    ],
)
def test_auto_captures_only_where_a_graph_can_hold_the_whole_step(device, fused, precision, distributed, mode):
    got, why = graph_mode("auto", device, fused=fused, precision=precision, distributed=distributed)
    assert got == mode and (why is None) == (mode == "capture")


def test_on_is_refused_where_it_cannot_capture_and_static_and_off_run_anywhere():
    with pytest.raises(ConfigError) as refused:
        graph_mode("on", CPU, fused=True, precision="fp32", distributed=False)
    assert refused.value.key == "trainer.cuda_graphs" and "need a GPU" in str(refused.value)
    with pytest.raises(ConfigError, match="fp16"):
        graph_mode("on", CUDA, fused=True, precision="fp16", distributed=False)
    assert graph_mode("on", CUDA, fused=True, precision="bf16", distributed=False) == ("capture", None)
    assert graph_mode("static", CPU, fused=False, precision="fp16", distributed=True)[0] == "static"
    assert graph_mode("off", CUDA, fused=True, precision="bf16", distributed=False)[0] == "off"


def test_the_noise_meters_squared_norm_casts_once_and_gives_the_same_value():
    torch.manual_seed(0)
    tensors = [torch.randn(s) for s in ((40, 3), (7,), (5, 5, 2))]
    per_tensor = torch.stack([n.double() for n in torch._foreach_norm(tensors)]).pow(2).sum()  # as it was
    assert torch.equal(squared_norm(tensors), per_tensor) and squared_norm(tensors).dtype == torch.float64


def test_the_loss_scale_is_read_on_the_device_and_equals_get_scale():
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    scale = loss_scale(scaler, CPU)
    assert isinstance(scale, torch.Tensor) and scale.item() == scaler.get_scale() == 2.0**16
    assert loss_scale(torch.amp.GradScaler("cpu", enabled=False), CPU) == 1.0


def test_the_cpus_epoch_order_is_the_one_it_always_was():
    expected = torch.randperm(1000, generator=torch.Generator().manual_seed(7 * 100_003 + 3))
    assert torch.equal(epoch_order(1000, 7, 3), expected) and torch.equal(epoch_order(1000, 7, 3, CPU), expected)


@pytest.mark.parametrize("n, batch, size", [(10_000, 1024, 1000), (10_001, 1024, 1001), (500, 1024, 500), (0, 8, 8)])
def test_one_evaluation_shape_covers_a_split_in_as_few_batches_padding_less_than_a_row_a_batch(n, batch, size):
    assert one_shape_size(n, batch) == size
    if n:
        batches = -(-n // batch)
        assert -(-n // size) == batches and size * batches - n < batches


def test_a_padded_evaluation_batch_is_one_shape_and_its_padding_is_labelled_to_be_left_out():
    split = TensorSplit(torch.arange(10.0)[:, None], torch.arange(10) % 3)
    plain = list(eval_batches(split, 4, CPU))
    padded = list(eval_batches(split, 4, CPU, one_shape=True))
    assert [len(y) for _, y in plain] == [4, 4, 2] and [len(y) for _, y in padded] == [4, 4, 4]
    x, y = padded[-1]
    assert y.tolist() == [2, 0, PAD_LABEL, PAD_LABEL] and x[:, 0].tolist() == [8.0, 9.0, 9.0, 9.0]
    real = torch.cat([y for _, y in padded])
    assert torch.equal(real[real != PAD_LABEL], torch.cat([y for _, y in plain]))


def test_an_update_is_graph_ready_only_fused_and_for_adam_capturable():
    params = [torch.nn.Parameter(torch.zeros(3))]
    assert "fused" in graph_ready(torch.optim.SGD(params, lr=0.1))  # foreach: reads a tensor LR on the host
    assert graph_ready(torch.optim.SGD(params, lr=0.1, fused=True)) is None  # SGD has no capturable flag
    assert "capturable" in graph_ready(torch.optim.AdamW(params, lr=0.1, fused=True))  # refused at capture
    assert graph_ready(torch.optim.AdamW(params, lr=0.1, fused=True, capturable=True)) is None
