"""model=gpt: its attention is causal, its embeddings tied, and on data=text accumulation trains it
exactly as one large batch (LayerNorm normalises each token alone: no coupling between samples);
its evaluation leaves a padded batch's rows out."""

import contextlib
import copy

import pytest
import torch

from bsexp.engine.datasets import TokenWindows
from bsexp.engine.distributed import World
from bsexp.engine.evaluate import evaluate
from bsexp.engine.gpt import GPT
from bsexp.engine.losses import mean_loss, summed_loss
from bsexp.engine.models import Checkpointed, checkpoint_blocks
from bsexp.train.loop import TrainState, build_loop, train
from tiny import assert_close, params

# A GPT small enough for a test, on a Markov source of a few thousand tokens.
TINY_GPT = [
    "model=gpt",
    "data=text",
    "data.context=12",
    "data.train_tokens=3072",
    "data.val_size=40",
    "model.width=32",
    "model.heads=2",
    "trainer.progress=false",
    "trainer.threads=1",
    "schedule.warmup_shape=none",
    "schedule.main=constant",
]


def test_changing_a_later_token_leaves_every_earlier_logit_unchanged():
    torch.manual_seed(0)
    model = GPT((16,), 50, layers=2, heads=4, width=32).eval()
    x = torch.randint(0, 50, (3, 16))
    changed = x.clone()
    changed[:, 10] = (x[:, 10] + 1) % 50
    with torch.no_grad():
        before, after = model(x), model(changed)
    assert before.shape == (3, 16, 50)
    assert torch.equal(before[:, :10], after[:, :10])  # positions 0..9 never see token 10
    assert (before[:, 10:] - after[:, 10:]).abs().amax(dim=-1).min() > 1e-4  # 10 and after do see it


def test_the_output_projection_is_the_token_embedding_and_counted_once():
    model = GPT((8,), 256, layers=1, heads=2, width=16)
    assert model.head.weight is model.tokens.weight
    per_block = 2 * 2 * 16 + (16 * 48 + 48) + (16 * 16 + 16) + (16 * 64 + 64) + (64 * 16 + 16)
    assert sum(p.numel() for p in model.parameters()) == 256 * 16 + 8 * 16 + per_block + 2 * 16


def test_a_sequences_loss_is_the_mean_over_its_tokens():
    logits, y = torch.randn(4, 6, 10), torch.randint(0, 10, (4, 6))
    per_token = torch.nn.functional.cross_entropy(logits.reshape(-1, 10), y.reshape(-1), reduction="none")
    assert torch.allclose(mean_loss(logits, y), per_token.mean())
    assert torch.allclose(summed_loss(logits, y), per_token.view(4, 6).mean(dim=1).sum())


# SGD, whose step is proportional to the gradient (Adam's would hide a loss scaled by a constant).
SGD = ["optimizer=sgd", "optimizer.lr=0.5", "optimizer.momentum=0"]


def test_micro_4_times_4_equals_one_batch_of_16(make_cfg):
    runs = []
    for batch in (["batch.size=16"], ["batch=accumulation", "batch.size=16", "batch.micro_size=4"]):
        loop = build_loop(make_cfg(*TINY_GPT, *batch, *SGD, "trainer.max_steps=4"))
        start = params(loop)
        assert train(loop, TrainState()) == "completed"
        runs.append((start, loop))
    (start, big), (_, accum) = runs
    assert accum.batch_control.current.accum_steps == 4 and big.batch_control.current.accum_steps == 1
    assert max((params(big)[k] - v).abs().max() for k, v in start.items()) > 1e-3  # the steps did move it
    assert_close(params(big), params(accum), atol=1e-5)  # to rounding: the same sums in another order


def test_a_padded_evaluation_batch_gives_the_loss_of_the_unpadded_ones():
    torch.manual_seed(0)
    model = GPT((8,), 256, layers=1, heads=2, width=16)
    split = TokenWindows.of(torch.randint(0, 256, (8 * 13 + 1,), dtype=torch.uint8), 8)
    assert len(split) == 13
    plain = evaluate(model, split, World(), contextlib.nullcontext, 5, one_shape=False)
    padded = evaluate(model, split, World(), contextlib.nullcontext, 5, one_shape=True)  # 5, 5, 3 + 2 padding
    assert padded == pytest.approx(plain, rel=1e-6)


def test_activation_checkpointing_wraps_each_block_and_gives_the_same_gradients():
    torch.manual_seed(0)
    plain = GPT((16,), 64, layers=3, heads=2, width=16)
    checkpointed = checkpoint_blocks(copy.deepcopy(plain))
    assert all(isinstance(block, Checkpointed) for block in checkpointed.blocks)
    x = torch.randint(0, 64, (4, 16))
    for model in (plain, checkpointed):
        mean_loss(model(x[:, :-1].contiguous()), x[:, 1:].contiguous()).backward()
    for (name, a), b in zip(plain.named_parameters(), checkpointed.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-7), name
