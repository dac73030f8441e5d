"""Training speed on one device, like for like: bsexp's step eager against a hand-written loop
eager, and bsexp's graphed step (trainer.cuda_graphs) against the hand loop capturing its whole
step in a CUDA graph (issues 44 and 59).

    python scripts/bench_gpu.py                        # on the GPU: the default run, ResNet-18, the GPT
    python scripts/bench_gpu.py --cases mnist1d --windows 7
    python scripts/bench_gpu.py --cpu                  # smoke: tiny sizes on the CPU, every code path
    python scripts/bench_gpu.py --json results.jsonl   # also one JSON line a case, appended

Cases, smallest first (each on the device at hand; --cpu: tiny stand-ins):
    mnist1d   the default run: the 1-D conv net on MNIST-1D, fp32, batch 128
    resnet18  ResNet-18 on 3 x 32 x 32 synthetic images, bf16, batch 512
    gpt       GPT-2 small's shape (12 layers, 12 heads, width 768, context 1,024, GPT-2's vocabulary
              of 50,257: 124M parameters) on the Markov bytes, AdamW, bf16, 16 sequences a step
              (16,384 tokens); also its tokens/s and the model FLOPs utilisation: (6 x parameters
              + 12 x layers x width x context) FLOPs a token (Kaplan et al.; PaLM's appendix B) on
              the GPU's bf16 peak

Sides, each timed over the same steps:
    bsexp eager     bsexp's training step as the loop runs it (bsexp.engine.step.train_step, the LR
                    written, the regularisers applied, the loss and accuracy summed on the device),
                    on the fast path (trainer.speed=fast) with trainer.cuda_graphs=off
    bsexp graphed   the same with trainer.cuda_graphs=on (on the CPU: static, the same step without
                    the capture)
    bsexp compiled  graphed, and the model compiled (trainer.compile_mode=default) inside bsexp's own
                    capture (--compile; off with --cpu unless asked)
    hand eager      what a person who knows the tricks writes: the same architecture (a copy of the
                    same weights), channels_last for images, fused SGD (AdamW for the GPT, as its
                    recipe) with the LR a tensor written each step, autocast, index batches gathered
                    on the device, zero_grad(set_to_none)
    hand graphed    the hand loop's whole step (gather, forward, backward, update) captured once in
                    a CUDA graph after three warm-up steps, replayed with a static index buffer
                    (on the CPU: the same body, called)

Every side trains --warmup untimed steps first (cuDNN's autotuner, the captures, the compile),
then --windows windows of --window steps each; the sides take turns window by window (the side
that starts rotates), the device synchronised around each window. Each side counts its own steps
through epochs of the same size drawn the same way (drop_last), so every side's windows cross the
same epoch boundaries. Prints, per case and side, the median samples/s over the windows and their
spread (min-max), the ratios bsexp / hand (goal 0.95 eager and graphed), the FLOPs of a step and
the TFLOP/s achieved. A measurement, not a test: the exit code is 0 unless it cannot run at all.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bsexp.config.schema import register_configs  # noqa: E402 (after the checkout is put on the path)
from bsexp.engine.step import train_step  # noqa: E402
from bsexp.runs.sweep import register_resolvers  # noqa: E402
from bsexp.system.runtime import DTYPES  # noqa: E402
from bsexp.train.loop import Loop, build_loop  # noqa: E402

GOAL = 0.95
# Dense bf16 tensor-core peaks (TFLOP/s), from the vendors' data sheets.
PEAK_BF16 = {"H100": 989.4, "H200": 989.4, "A100": 312.0, "L40S": 362.1, "A10G": 70.0}
SMOKE = ["trainer.threads=1", "data=synthetic", "data.num_samples=600", "batch.size=16"]  # --cpu: seconds a case
CASES = {  # smallest first: a check short of time still measures one
    "mnist1d": {"cuda": [], "cpu": [*SMOKE, "data.shape=[1,40]", "model.width=8"]},
    "resnet18": {
        "cuda": ["data=synthetic", "data.shape=[3,32,32]", "data.num_samples=20480", "model=resnet18", "precision=bf16"]
        + ["batch.size=512"],
        "cpu": [*SMOKE, "data.shape=[3,16,16]", "model=cnn", "model.width=8", "precision=bf16"],
    },
    "gpt": {
        "cuda": ["model=gpt", "data=text", "data.context=1024", "data.vocab=50257", "data.train_tokens=4194304"]
        + ["model.layers=12", "model.heads=12", "model.width=768", "precision=bf16", "batch.size=16"],
        "cpu": ["trainer.threads=1", "model=gpt", "data=text", "data.train_tokens=8192", "model.layers=1"]
        + ["model.width=32", "model.heads=2", "batch.size=16", "precision=bf16"],
    },
}
SIDES = ("bsexp eager", "hand eager", "bsexp graphed", "hand graphed", "bsexp compiled")


def build(overrides: list[str]) -> Loop:
    register_configs()
    register_resolvers()
    with initialize_config_dir(config_dir=str(ROOT / "bsexp" / "conf"), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "logger=none",
                "trainer.progress=false",
                "trainer.speed=fast",
                "data.val_size=128",
                "batch.drop_last=true",
                "epochs=200",  # steps enough for any window: the bench never evaluates
                *overrides,
            ],
        )
    return build_loop(cfg)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class BsexpSteps:
    """bsexp's step as the loop takes it, continued across epochs (bsexp.train.loop.train)."""

    def __init__(self, loop: Loop) -> None:
        self.loop, self.index, self.epoch, self.batches = loop, 0, 0, iter(())
        self.sums = torch.zeros((), device=loop.world.device), torch.zeros((), device=loop.world.device)

    @property
    def batch(self) -> int:
        return self.loop.batch_control.current.size

    def run(self, steps: int) -> None:
        loop = self.loop
        layout = loop.batch_control.layout
        for _ in range(steps):
            item = next(self.batches, None)
            if item is None:  # the next epoch: a new order, as the loop draws it
                sizes = loop.batch_control.epoch_sizes(self.epoch % len(layout.run.epoch_starts))
                self.batches = iter(loop.feed.steps(self.epoch, sizes, drop_last=True))
                self.epoch += 1
                item = next(self.batches)
            x, y, samples = item
            step = self.index % layout.total
            loop.hyperparameters.apply(step, layout)
            plan = loop.batch_control.plan(step)
            loop.regularisers.apply(plan.size)
            loss_sum, correct, _ = train_step(loop.step, x, y, samples, plan)
            self.sums[0].add_(loss_sum)
            self.sums[1].add_(correct)
            self.index += 1


class HandSteps:
    """The hand loop on a copy of the same model and data; `graphed`: its whole step in one CUDA
    graph (without CUDA: the same body, called)."""

    def __init__(self, loop: Loop, precision: str, graphed: bool) -> None:
        self.device, self.split = loop.world.device, loop.feed.split
        self.images = getattr(self.split, "x", None) is not None and self.split.x.dim() == 4
        self.model = copy.deepcopy(loop.step.net)
        if self.images:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.lr = torch.tensor(0.1, device=self.device)
        if isinstance(loop.step.optimizer, torch.optim.AdamW):  # the GPT's recipe: like for like
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=0.0, fused=True)
        else:
            self.opt = torch.optim.SGD(self.model.parameters(), lr=self.lr, momentum=0.9, weight_decay=5e-4, fused=True)
        dtype = DTYPES.get(precision)
        self.autocast = lambda: torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None)
        self.batch, self.graphed = loop.batch_control.current.size, graphed
        self.n, self.index, self.order = len(self.split), 0, None
        self.static_index = torch.zeros(self.batch, dtype=torch.long, device=self.device)
        self.graph = None

    def _body(self) -> None:
        x, y = self.split.batch(self.static_index)
        if self.images:
            x = x.contiguous(memory_format=torch.channels_last)
        self.opt.zero_grad(set_to_none=not self.graphed)
        with self.autocast():
            logits = self.model(x)  # a language model's: (batch, context, vocabulary), a target per position
            loss = F.cross_entropy(logits.flatten(0, -2), y.flatten())
        loss.backward()
        self.opt.step()

    def _next_index(self) -> torch.Tensor:
        per_epoch = self.n // self.batch  # drop_last, as bsexp's side
        position = self.index % per_epoch
        if position == 0:  # a new epoch: a new order, drawn on the device
            generator = torch.Generator(device=self.device).manual_seed(self.index // per_epoch)
            self.order = torch.randperm(self.n, generator=generator, device=self.device)
        self.index += 1
        return self.order[position * self.batch : (position + 1) * self.batch]

    def _capture(self) -> None:
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(3):  # warm-up on the capture's stream: cuDNN, cuBLAS, the optimizer's state
                self.static_index.copy_(self._next_index())
                self._body()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=stream):
            self._body()

    def run(self, steps: int) -> None:
        if self.graphed and self.graph is None and self.device.type == "cuda":
            self._capture()
        for _ in range(steps):
            self.static_index.copy_(self._next_index())
            self.lr.fill_(0.1)  # as a schedule writes it each step
            if self.graph is not None:
                self.graph.replay()
            else:
                self._body()

    def flops(self) -> int:
        from torch.utils.flop_counter import FlopCounterMode

        saved = copy.deepcopy(self.model.state_dict()), copy.deepcopy(self.opt.state_dict())
        with FlopCounterMode(display=False) as counter:
            self.static_index.copy_(torch.arange(self.batch, device=self.device))
            self._body()
        self.model.load_state_dict(saved[0])
        self.opt.load_state_dict(saved[1])
        return counter.get_total_flops()


def time_windows(sides: dict, device: torch.device, warmup: int, window: int, windows: int) -> dict[str, list[float]]:
    """Samples/s of each side in each window, the sides taking turns (see the module's docstring)."""
    for side in sides.values():
        side.run(warmup)
    sync(device)
    rates: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for w in range(windows):
        for name in names[w % len(names) :] + names[: w % len(names)]:
            sync(device)
            started = time.perf_counter()
            sides[name].run(window)
            sync(device)
            rates[name].append(window * sides[name].batch / (time.perf_counter() - started))
    return rates


def model_flops_per_token(loop: Loop) -> float | None:
    """A language model's FLOPs a token for training, the usual count of model FLOPs utilisation:
    6 x parameters (forward and backward through every weight) + 12 x layers x width x context
    (the attention's scores and weighted sums); None for other models."""
    tokens = loop.splits.tokens
    if tokens is None:
        return None
    net = loop.step.net
    params = sum(p.numel() for p in net.parameters())
    layers, width = len(net.blocks), net.positions.embedding_dim
    return 6 * params + 12 * layers * width * tokens.context


def case_sides(case: str, device: str, compiled: bool) -> tuple[dict, int]:
    """The sides of a case, and the FLOPs of one of its steps."""
    overrides = [f"device={device}", *CASES[case][device]]
    graphs = "on" if device == "cuda" else "static"
    eager_loop = build([*overrides, "trainer.cuda_graphs=off"])
    precision = next((o.split("=")[1] for o in overrides if o.startswith("precision=")), "fp32")
    sides = {
        "bsexp eager": BsexpSteps(eager_loop),
        "hand eager": HandSteps(eager_loop, precision, graphed=False),
        "bsexp graphed": BsexpSteps(build([*overrides, f"trainer.cuda_graphs={graphs}"])),
        "hand graphed": HandSteps(eager_loop, precision, graphed=True),
    }
    if compiled:
        sides["bsexp compiled"] = BsexpSteps(
            build([*overrides, f"trainer.cuda_graphs={graphs}", "trainer.compile_mode=default"])
        )
    return sides, sides["hand eager"].flops()


def row(case: str, rates: dict[str, list[float]], flops: int, batch: int, peak: float | None, loop: Loop) -> dict:
    """One case's figures: each side's median and spread, the ratios, the FLOPs and TFLOP/s; a
    language model's tokens/s and model FLOPs utilisation too."""
    median = {name: statistics.median(r) for name, r in rates.items()}
    best = max(median.get("bsexp graphed", 0), median.get("bsexp compiled", 0), median["bsexp eager"])
    achieved = flops / batch * best / 1e12
    per_token, tokens = model_flops_per_token(loop), loop.splits.tokens
    lm = {}
    if per_token is not None:
        tokens_per_s = best * tokens.context
        lm = {
            "tokens_per_s": {name: round(m * tokens.context) for name, m in median.items()},
            "model_flops_per_token": per_token,
            "mfu": per_token * tokens_per_s / (peak * 1e12) if peak else None,
        }
    return {
        "case": case,
        "samples_per_s": {name: round(m) for name, m in median.items()},
        "spread": {name: [round(min(r)), round(max(r))] for name, r in rates.items()},
        "eager_vs_hand": median["bsexp eager"] / median["hand eager"],
        "graphed_vs_hand": median["bsexp graphed"] / median["hand graphed"],
        "graphed_vs_eager": median["bsexp graphed"] / median["bsexp eager"],
        "gflop_per_step": flops / 1e9,
        "tflops_best": achieved,
        "of_bf16_peak": achieved / peak if peak else None,
        **lm,
    }


def show(r: dict) -> str:
    cells = [
        f"{r['samples_per_s'][s]:,} ({r['spread'][s][0]:,}-{r['spread'][s][1]:,})" if s in r["samples_per_s"] else "-"
        for s in SIDES
    ]
    peak = f"{100 * r['of_bf16_peak']:.1f} %" if r["of_bf16_peak"] else "-"
    line = (
        f"| {r['case']} | {' | '.join(cells)} | {r['eager_vs_hand']:.2f} | {r['graphed_vs_hand']:.2f} | "
        f"{r['graphed_vs_eager']:.2f} | {r['gflop_per_step']:,.1f} | {r['tflops_best']:.2f} | {peak} |"
    )
    if "tokens_per_s" in r:  # a language model: tokens/s and the model FLOPs utilisation, after the table row
        tokens = ", ".join(f"{s} {n:,}" for s, n in r["tokens_per_s"].items())
        mfu = f"{100 * r['mfu']:.1f} % of the bf16 peak" if r["mfu"] else "- (no GPU peak known)"
        line += f"\n\n{r['case']}: tokens/s: {tokens}; model FLOPs utilisation (bsexp's best): {mfu}\n"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="mnist1d,resnet18,gpt", help="comma-separated: mnist1d, resnet18, gpt")
    parser.add_argument("--warmup", type=int, help="untimed steps a side first (12; --cpu: 4)")
    parser.add_argument("--window", type=int, help="steps a window (40; --cpu: 4)")
    parser.add_argument("--windows", type=int, help="timed windows a side (5; --cpu: 2)")
    parser.add_argument("--cpu", action="store_true", help="a smoke run on the CPU at tiny sizes")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None, help="bsexp compiled too")
    parser.add_argument("--json", type=Path, help="append one JSON line a case here")
    args = parser.parse_args()
    device = "cpu" if args.cpu or not torch.cuda.is_available() else "cuda"
    for key, gpu, smoke in (("warmup", 12, 4), ("window", 40, 4), ("windows", 5, 2)):
        if getattr(args, key) is None:
            setattr(args, key, smoke if args.cpu else gpu)
    compiled = device == "cuda" if args.compile is None else args.compile
    name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
    print(
        f"{name}; torch {torch.__version__}; {args.windows} windows of {args.window} steps a side after {args.warmup}"
    )
    print(
        "| case | " + " | ".join(f"{s} samples/s (spread)" for s in SIDES) + " | bsexp / hand, eager "
        "| bsexp / hand, graphed | graphed / eager | GFLOP a step | TFLOP/s (bsexp's best) | of bf16 peak |"
    )
    print("|" + " --- |" * (len(SIDES) + 7), flush=True)
    for case in args.cases.split(","):
        try:
            sides, flops = case_sides(case, device, compiled)
            rates = time_windows(sides, torch.device(device), args.warmup, args.window, args.windows)
            loop = sides["bsexp eager"].loop
            result = row(case, rates, flops, sides["bsexp eager"].batch, peak if device == "cuda" else None, loop)
            graphs = sides["bsexp graphed"].loop.step.graphs
            result["graphs"] = graphs.summary() if graphs is not None else None
            result.update(device=name, torch=torch.__version__)
            print(show(result), flush=True)
        except Exception as exc:  # one case's failure is a row, and the next case runs
            why = " ".join(str(exc).split())[:300].replace("|", "/")
            result = {"case": case, "failed": f"{type(exc).__name__}: {why}"}
            print(f"| {case} | failed: {result['failed']} |" + " |" * (len(SIDES) + 5), flush=True)
        if args.json:
            with args.json.open("a") as out:
                out.write(json.dumps(result) + "\n")
    print(
        f"goal: bsexp / hand >= {GOAL} eager and graphed; resnet18 graphed >= 80,000 samples/s on an H200 "
        f"(70,000 on an H100); gpt's model FLOPs utilisation >= 40 % of the bf16 peak; the default run end to end "
        f">= 4 x its samples/s on 2 CPU cores"
    )


if __name__ == "__main__":
    main()
