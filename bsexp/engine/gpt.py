"""A decoder-only transformer language model (GPT-2's shape, Radford et al. 2019, as nanoGPT writes
it): token and position embeddings, pre-LayerNorm blocks of causal self-attention (through
`F.scaled_dot_product_attention`, which picks the flash or memory-efficient kernel where there is
one) and a GELU MLP, a final LayerNorm, and the output projection tied to the token embedding. No
BatchNorm: the samples of a batch never meet, so accumulation and ranks train exactly as one
large batch does (to rounding).

It takes what every bsexp model takes: `input_shape` is (context,), the tokens of a sample, and
`num_classes` the vocabulary; it maps token ids (N, T) to next-token logits (N, T, vocabulary)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class SelfAttention(nn.Module):
    """Causal multi-head self-attention: each position attends to itself and those before it."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.proj_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, width = x.shape
        # (N, T, 3W) -> three of (N, heads, T, W / heads)
        q, k, v = self.qkv(x).view(n, t, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.proj_dropout(self.proj(y.transpose(1, 2).reshape(n, t, width)))


class Block(nn.Module):
    """Pre-LayerNorm: x + attention(norm(x)), then x + MLP(norm(x)) (GPT-2's order)."""

    def __init__(self, width: int, heads: int, dropout: float, norm: str) -> None:
        super().__init__()
        self.norm1, self.norm2 = _norm(norm, width), _norm(norm, width)
        self.attention = SelfAttention(width, heads, dropout)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def _norm(kind: str, width: int) -> nn.Module:
    return nn.LayerNorm(width) if kind == "layer" else nn.Identity()


class GPT(nn.Module):
    """`layers` blocks of `width` features in `heads` heads, over a context of `input_shape[0]`
    tokens and a vocabulary of `num_classes`. `dropout`: on the embeddings, the attention weights
    and each residual branch (0: none). `norm`: layer, or none."""

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        layers: int,
        heads: int,
        width: int,
        norm: str = "layer",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if len(input_shape) != 1:
            raise ValueError(
                f"gpt needs token sequences shaped (context,), got inputs shaped {tuple(input_shape)}: use data=text"
            )
        if width % heads:
            raise ValueError(f"model.width={width} must be a multiple of model.heads={heads}")
        if norm not in ("layer", "none"):
            raise ValueError(f"model.norm={norm}: a transformer normalises each token alone; valid: layer, none")
        self.context = int(input_shape[0])
        self.tokens = nn.Embedding(num_classes, width)
        self.positions = nn.Embedding(self.context, width)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*(Block(width, heads, dropout, norm) for _ in range(layers)))
        self.norm = _norm(norm, width)
        self.head = nn.Linear(width, num_classes, bias=False)
        self.head.weight = self.tokens.weight  # tied (Press & Wolf 2017): one matrix, counted once
        self._init(layers)

    def _init(self, layers: int) -> None:
        """GPT-2's initialisation: N(0, 0.02) weights, zero biases, and the projections back into
        the residual stream scaled by 1/sqrt(2 x layers), so that its variance does not grow with depth."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for block in self.blocks:
            for proj in (block.attention.proj, block.mlp[2]):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * layers))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.context:
            raise ValueError(f"a sequence of {t} tokens is longer than the model's context of {self.context}")
        positions = torch.arange(t, device=idx.device)
        x = self.dropout(self.tokens(idx) + self.positions(positions))
        return self.head(self.norm(self.blocks(x)))


def flops_per_token(model: GPT) -> float:
    """Training FLOPs per token (forward and backward), as nanoGPT and the PaLM paper count them:
    6 x the parameters (the position table left out: it is looked up, not multiplied), plus the
    attention's scores and weighted sum, 12 x layers x width x context (Kaplan et al. 2020; no
    halving for the causal mask, as both count it)."""
    params = sum(p.numel() for p in model.parameters()) - model.positions.weight.numel()
    width = model.tokens.embedding_dim
    return 6 * params + 12 * len(model.blocks) * width * model.context
