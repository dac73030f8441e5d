"""Models (and data) of the kind a user brings with `_target_`, living outside bsexp."""

import os

import torch
from torch import nn

from bsexp.engine.datasets import synthetic


class TinyNet(nn.Module):
    """Flatten -> hidden -> classes. `fail_at_step` raises a real error in that training forward."""

    def __init__(self, input_shape, num_classes, hidden: int = 16, fail_at_step: int = 0):
        super().__init__()
        width = int(torch.tensor(list(input_shape)).prod())
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))
        self.fail_at_step, self.calls = fail_at_step, 0

    def forward(self, x):
        if self.training:
            self.calls += 1
            if self.calls == self.fail_at_step:
                raise RuntimeError(f"TinyNet failed on purpose at training step {self.calls}")
        return self.net(x)


class FailsWhileFlagged(TinyNet):
    """Raises in its `fail_at_step`-th training forward while the file `flag` names its `hidden`
    size: a fault from outside the run (a bad node, a full disk) that is gone once it is fixed."""

    def __init__(self, input_shape, num_classes, hidden: int = 16, flag: str = "", fail_at_step: int = 3):
        super().__init__(input_shape, num_classes, hidden)
        self.hidden, self.flag, self.fail_at = hidden, flag, fail_at_step

    def forward(self, x):
        if self.training:
            self.calls += 1
            named = open(self.flag).read().split() if self.flag and os.path.isfile(self.flag) else []
            if self.calls == self.fail_at and str(self.hidden) in named:
                raise RuntimeError(f"FailsWhileFlagged: hidden {self.hidden} is flagged in {self.flag}")
        return self.net(x)


class FailsOnRank(TinyNet):
    """Raises in its `fail_at_step`-th training forward on rank `rank` only; the other ranks wait
    in the next collective, as a real crash would leave them."""

    def __init__(self, input_shape, num_classes, rank: int = 1, fail_at_step: int = 3):
        super().__init__(input_shape, num_classes)
        self.rank, self.fail_at = rank, fail_at_step

    def forward(self, x):
        import os

        if self.training:
            self.calls += 1
            if self.calls == self.fail_at and os.environ.get("RANK") == str(self.rank):
                raise RuntimeError(f"FailsOnRank: rank {self.rank} crashed at step {self.calls}")
        return self.net(x)


class RaisesAbove(TinyNet):
    """A model with a bug that only large batches reach: a non-OOM error the finder must not hide."""

    def __init__(self, input_shape, num_classes, above: int = 100):
        super().__init__(input_shape, num_classes)
        self.above = above

    def forward(self, x):
        if len(x) > self.above:
            raise ValueError(f"RaisesAbove: batch of {len(x)} > {self.above}")
        return self.net(x)


class HeavyPerSample(TinyNet):
    """Needs `mb_per_sample` MB of real memory per training sample (a scratch activation), so that
    under a memory cap every micro-batch above some size fails in the allocator."""

    def __init__(self, input_shape, num_classes, mb_per_sample: float = 1.0):
        super().__init__(input_shape, num_classes)
        self.floats = int(mb_per_sample * 2**18)  # float32s in mb_per_sample MB

    def forward(self, x):
        out = self.net(x)
        if self.training:
            scratch = torch.ones(len(x), self.floats, device=x.device)
            out = out + 0 * scratch.mean()
        return out


class DiesOnce(TinyNet):
    """Kills its own process (SIGKILL: no cleanup, as a crash or the OOM killer would) in its
    `die_at`-th training forward on rank `rank`, in the first attempt of a torchrun job only."""

    def __init__(self, input_shape, num_classes, rank: int = 1, die_at: int = 25):
        super().__init__(input_shape, num_classes, hidden=32)
        self.rank, self.die_at = rank, die_at

    def forward(self, x):
        import os
        import signal

        if self.training:
            self.calls += 1
            first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
            if self.calls == self.die_at and first_attempt and os.environ.get("RANK") == str(self.rank):
                os.kill(os.getpid(), signal.SIGKILL)
        return self.net(x)


def logged_synthetic(log: str, **kwargs):
    """bsexp's synthetic data, each load noted in `log` (the loading process's id)."""
    with open(log, "a") as out:
        out.write(f"{os.getpid()}\n")
    return synthetic(**kwargs)


class SignalsAtEval(TinyNet):
    """Sends its own process SIGINT (a Ctrl-C) in the first evaluation forward of a batch of
    `size` samples: the test split's, after the last step, where no step boundary is left to
    stop at."""

    def __init__(self, input_shape, num_classes, size: int = 120):
        super().__init__(input_shape, num_classes)
        self.size, self.sent = size, False

    def forward(self, x):
        if not self.training and len(x) == self.size and not self.sent:
            import signal

            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)
        return self.net(x)
