"""bsexp's gradient buckets (trainer.oom_recovery under DDP): reduced while the backward runs, the
gradients views of the buckets (no copy), and a backward that fails on one rank leaves no rank
waiting: every rank makes the same reductions and learns of the failure."""

import pytest
import torch

import dist_workers


def summed_gradients(result):
    """The gradients of the two ranks' losses, summed: what every rank must hold after the reduction."""
    layers = [torch.nn.Linear(6, 6, bias=False) for _ in range(3)]
    with torch.no_grad():
        for layer, weight in zip(layers, result["weights"]):
            layer.weight.copy_(weight)
    x = result["x"] / (result["x"][0, 1])  # rank 0's batch (rank r's is (r + 1) x it)
    for scale in (1, 2):
        layers[2](layers[1](layers[0](x * scale))).pow(2).sum().backward()
    return [layer.weight.grad for layer in layers]


def test_buckets_are_reduced_during_the_backward_into_the_gradients_themselves():
    ranks = dist_workers.launch(dist_workers.bucketed_backward, None)
    for rank in ranks.values():
        assert not rank["first"]["failed"] and not rank["second_failed"]
        # The last layer's gradient is complete first and its bucket goes at once: the first
        # bucket is on its way before the backward reaches the first layer.
        assert rank["ready"] == [(2, 1), (1, 2), (0, 3)]
        assert rank["views"]
        for got, expected in zip(rank["grads"], summed_gradients(ranks[0])):
            torch.testing.assert_close(got, expected)
    # The noise meter's squared norm is this rank's own gradient, taken before the reduction (rank
    # 1's batch is twice rank 0's, and the loss quadratic: its gradient 4 times, squared 16).
    assert ranks[1]["first"]["local_sq"] == pytest.approx(16 * ranks[0]["first"]["local_sq"], rel=1e-6)


def test_a_backward_that_fails_on_one_rank_is_known_on_both_and_the_next_step_reduces_as_ever():
    ranks = dist_workers.launch(dist_workers.bucketed_backward, 1)
    # Rank 1 stopped after its last layer's gradient (one bucket launched); it launched the other
    # two after the fault, so rank 0's three reductions were matched and both ranks learnt of it.
    assert ranks[1]["first"]["ready"] == [(2, 1)] and ranks[0]["first"]["ready"] == [(2, 1), (1, 2), (0, 3)]
    assert ranks[0]["first"]["failed"] and ranks[1]["first"]["failed"]
    for rank in ranks.values():
        assert not rank["second_failed"]
        for got, expected in zip(rank["grads"], summed_gradients(ranks[0])):
            torch.testing.assert_close(got, expected)
