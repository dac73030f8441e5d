"""The loss and the correct count of a batch, for classifiers and language models alike: the one
definition the training step, the evaluation and the noise meter share.

A classifier's logits are (N, classes) against labels (N,). A language model's are (N, T,
vocabulary) against the next tokens (N, T): a sample is a sequence, its loss the mean over its T
tokens (nats per token) and its "correct" the fraction of its tokens predicted right. Summed over
samples and divided by the samples of a step, that is the mean per token over the step, since every
sequence has the same T (the step's exact normalisation by samples carries over unchanged)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def mean_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the batch (per token for sequences)."""
    if logits.dim() == 3:
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())
    return F.cross_entropy(logits, y)


def summed_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy summed over the samples (each sequence's: the mean over its tokens); a label of
    -100 (F.cross_entropy's ignore_index: an evaluation batch's padding) adds nothing."""
    if logits.dim() == 3:
        return F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum") / y.shape[1]
    return F.cross_entropy(logits, y, reduction="sum")


def counted(y: torch.Tensor, pad: int) -> torch.Tensor:
    """The samples of a batch that are not padding (a padded row's label, or every token of it, is `pad`)."""
    return (y != pad).sum() if y.dim() == 1 else (y[:, 0] != pad).sum()


def correct(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Samples predicted right: for sequences, each one's fraction of tokens predicted right."""
    hits = logits.argmax(dim=-1) == y
    return hits.sum() if hits.dim() == 1 else hits.sum() / y.shape[1]
