"""Built-in models. Each takes the data's `input_shape` and `num_classes` plus its own options
(their defaults live in the schema, bsexp.config.schema); any `_target_` callable with that
signature that returns an `nn.Module` can replace them."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from bsexp.config.schema import NORMS
from bsexp.engine.gpt import GPT


def norm_layer(kind: str, channels: int, dims: int) -> nn.Module:
    """A normalisation over `channels` features for `dims`-D feature maps (0 = flat vectors)."""
    if kind == "batch":
        return (nn.BatchNorm1d, nn.BatchNorm1d, nn.BatchNorm2d)[dims](channels)
    if kind == "group":  # Wu & He 2018 use 32 groups; fewer when there are fewer channels
        return nn.GroupNorm(_groups(channels), channels)
    if kind == "layer":
        return nn.LayerNorm(channels) if dims == 0 else nn.GroupNorm(1, channels)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"model.norm={kind}: valid: {', '.join(NORMS)}")


def _groups(channels: int, preferred: int = 32) -> int:
    groups = min(preferred, channels)
    while channels % groups:
        groups -= 1
    return groups


class MLP(nn.Module):
    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        hidden: Sequence[int],
        norm: str,
        dropout: float,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = int(torch.tensor(list(input_shape)).prod())
        for out in hidden:
            layers += [nn.Linear(width, out), norm_layer(norm, out, 0), nn.ReLU(), nn.Dropout(dropout)]
            width = out
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _conv_block(conv: type[nn.Module], dims: int, c_in: int, c_out: int, stride: int, norm: str):
    bias = norm == "none"  # a norm layer's shift makes the bias redundant
    return nn.Sequential(
        conv(c_in, c_out, 3, stride=stride, padding=1, bias=bias), norm_layer(norm, c_out, dims), nn.ReLU()
    )


class _ConvNet(nn.Module):
    """Three stages of two 3-wide convs, doubling the width and halving the resolution between
    stages, then global average pooling and a linear head. `dims` is 1 (sequences) or 2 (images)."""

    def __init__(
        self, dims: int, input_shape: Sequence[int], num_classes: int, width: int, norm: str, dropout: float = 0.0
    ):
        super().__init__()
        conv, pool = ((nn.Conv1d, nn.AdaptiveAvgPool1d), (nn.Conv2d, nn.AdaptiveAvgPool2d))[dims - 1]
        c = input_shape[0]
        blocks: list[nn.Module] = []
        for stage, w in enumerate((width, 2 * width, 4 * width)):
            blocks += [
                _conv_block(conv, dims, c, w, 1 if stage == 0 else 2, norm),
                _conv_block(conv, dims, w, w, 1, norm),
            ]
            c = w
        self.features = nn.Sequential(*blocks)
        self.head = nn.Sequential(pool(1), nn.Flatten(), nn.Linear(c, num_classes))
        self.dropout = nn.Dropout(dropout)  # before the linear head (no state: the checkpoint's keys stay)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = self.head[:2](self.features(x))
        return self.head[2](_dropped(self.dropout, pooled))


def _dropped(dropout: nn.Dropout, x: torch.Tensor) -> torch.Tensor:
    """`x` through `dropout` where it drops anything: a rate of 0 draws no random numbers, so a
    model without dropout trains as it did before it had the layer."""
    return dropout(x) if dropout.p else x


class CNN1d(_ConvNet):
    """Conv net for sequences (N, C, L) such as MNIST-1D."""

    def __init__(self, input_shape: Sequence[int], num_classes: int, width: int, norm: str, dropout: float = 0.0):
        if len(input_shape) != 2:
            raise ValueError(f"cnn1d needs inputs shaped (channels, length), got {tuple(input_shape)}")
        super().__init__(1, input_shape, num_classes, width, norm, dropout)


class CNN(_ConvNet):
    """Small conv net for (N, C, H, W) images."""

    def __init__(self, input_shape: Sequence[int], num_classes: int, width: int, norm: str, dropout: float = 0.0):
        if len(input_shape) != 3:
            raise ValueError(f"cnn needs inputs shaped (channels, height, width), got {tuple(input_shape)}")
        super().__init__(2, input_shape, num_classes, width, norm, dropout)


def resnet18(input_shape: Sequence[int], num_classes: int, norm: str, cifar_stem: bool, dropout: float = 0.0):
    """torchvision's ResNet-18. `cifar_stem` swaps the 7×7/2 conv and max-pool for a 3×3/1 conv,
    the usual stem for 32×32 images."""
    from torchvision.models import resnet18 as tv_resnet18

    if len(input_shape) != 3:
        raise ValueError(f"resnet18 needs inputs shaped (channels, height, width), got {tuple(input_shape)}")
    model = tv_resnet18(num_classes=num_classes, norm_layer=lambda c: norm_layer(norm, c, 2))
    if cifar_stem:
        model.conv1 = nn.Conv2d(input_shape[0], 64, 3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif input_shape[0] != 3:
        model.conv1 = nn.Conv2d(input_shape[0], 64, 7, stride=2, padding=3, bias=False)
    model.dropout = nn.Dropout(dropout)  # before the linear head (no state: the checkpoint's keys stay)
    model.fc.register_forward_pre_hook(functools.partial(_drop_input, model.dropout))  # copied with the model
    return model


def _drop_input(dropout: nn.Dropout, module: nn.Module, args: tuple) -> tuple:
    return (_dropped(dropout, args[0]), *args[1:])


# ---------------------------------------------------------------------------- ghost batch normalisation


class GhostBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm over ghost batches (Hoffer et al. 2017, "Train longer, generalize better"): in
    training, a batch of B samples is normalised in B // `ghost_size` near-equal chunks (each of at
    least `ghost_size` samples, exactly that many where it divides B), each with its own
    statistics, as if the batch were that many micro-batches; the running statistics take the
    chunks in turn, as accumulation over micro-batches of that size does. A batch of fewer than
    2 × `ghost_size` is one chunk: BatchNorm's. Evaluation uses the running statistics, as BatchNorm does."""

    def __init__(self, num_features: int, ghost_size: int, **kwargs) -> None:
        super().__init__(num_features, **kwargs)
        self.ghost_size = ghost_size

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2-D input (got {x.dim()}-D)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chunks = x.shape[0] // self.ghost_size
        if not self.training or chunks < 2:
            return super().forward(x)
        return torch.cat([super(GhostBatchNorm, self).forward(part) for part in x.tensor_split(chunks)])

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, ghost_size={self.ghost_size}"


def ghost_batchnorm(module: nn.Module, ghost_size: int) -> tuple[nn.Module, int]:
    """Every BatchNorm in `module` made a GhostBatchNorm of `ghost_size` (same parameters and
    buffers, so the same state_dict keys); returns the module and how many were converted."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, GhostBatchNorm):
        ghost = GhostBatchNorm(
            module.num_features,
            ghost_size,
            eps=module.eps,
            momentum=module.momentum,
            affine=module.affine,
            track_running_stats=module.track_running_stats,
        )
        ghost.load_state_dict(module.state_dict())
        ghost.train(module.training)
        return ghost, 1
    converted = 0
    for name, child in module.named_children():
        child, count = ghost_batchnorm(child, ghost_size)
        module.add_module(name, child)
        converted += count
    return module, converted


# ---------------------------------------------------------------------------- activation checkpointing


class Checkpointed(nn.Module):
    """`block` with its activations recomputed in the backward pass instead of kept
    (torch.utils.checkpoint; Chen et al. 2016): memory per sample traded for a second forward.
    A recomputation would update BatchNorm's running statistics twice; buffers are put back after
    it, so a checkpointed run trains exactly as the plain one. `enabled=False` runs it plainly."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block, self.enabled = block, True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.enabled and self.training and torch.is_grad_enabled()):
            return self.block(x)
        return checkpoint(self.block, x, use_reentrant=False, context_fn=self._contexts)

    def _contexts(self):
        return contextlib.nullcontext(), _buffers_kept(self.block)


@contextlib.contextmanager
def _buffers_kept(module: nn.Module):
    saved = [(buffer, buffer.clone()) for buffer in module.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)


def checkpoint_blocks(model: nn.Module) -> nn.Module:
    """`model.activation_checkpointing=true`: each block of a built-in model checkpointed (the
    conv nets' conv-norm-ReLU blocks, ResNet-18's residual blocks, the GPT's transformer blocks,
    the MLP's hidden layers), or for any other nn.Sequential its children in about sqrt(n)
    segments (Chen et al.'s choice: memory ~ 2 sqrt(n) layers' activations). Anything else: ValueError."""
    from torchvision.models import ResNet

    if isinstance(model, GPT):
        for i, block in enumerate(model.blocks):
            model.blocks[i] = Checkpointed(block)
    elif isinstance(model, _ConvNet):
        for i, block in enumerate(model.features):
            model.features[i] = Checkpointed(block)
    elif isinstance(model, MLP):  # Flatten, (Linear, norm, ReLU, Dropout) per hidden layer, Linear
        layers = list(model.net)
        hidden = [Checkpointed(nn.Sequential(*layers[i : i + 4])) for i in range(1, len(layers) - 1, 4)]
        model.net = nn.Sequential(layers[0], *hidden, layers[-1])
    elif isinstance(model, ResNet):
        for stage in (model.layer1, model.layer2, model.layer3, model.layer4):
            for i, block in enumerate(stage):
                stage[i] = Checkpointed(block)
    elif isinstance(model, nn.Sequential):
        children = list(model)
        size = max(1, math.ceil(math.sqrt(len(children))))
        model = nn.Sequential(
            *(Checkpointed(nn.Sequential(*children[i : i + size])) for i in range(0, len(children), size))
        )
    else:
        raise ValueError(
            f"{type(model).__name__} is neither a built-in model nor an nn.Sequential: bsexp does not know its blocks"
        )
    return model


def set_checkpointing(model: nn.Module, enabled: bool) -> int:
    """Turn every checkpointed block on or off; returns how many there are."""
    blocks = [m for m in model.modules() if isinstance(m, Checkpointed)]
    for block in blocks:
        block.enabled = enabled
    return len(blocks)
