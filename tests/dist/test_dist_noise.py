"""The gradient noise scale over two ranks: each rank's gradient before the all-reduce against the all-reduced one."""

import pytest

import dist_workers
from bsexp.train.loop import build_loop
from exact_noise import LOGISTIC, exact_noise

# The backward hooks that count backward passes see no input gradients (the data needs none).
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")


@pytest.mark.slow  # 17-32 s on 2 cores: scripts/test_slow.sh (the default tiers' time)
def test_two_ranks_measure_it_from_each_ranks_gradient_before_the_all_reduce(make_cfg):
    cfg = make_cfg(*LOGISTIC, "batch.size=64", "distributed=ddp", "distributed.nproc_per_node=2",
                   "trainer.oom_recovery=false")  # one micro-batch a rank: DDP's communication hook sees it
    ranks = dist_workers.launch(dist_workers.train_steps, cfg)
    single = make_cfg(*LOGISTIC, "batch.size=64")
    loop = build_loop(single)
    g2, tr = exact_noise(loop)
    found = ranks[0]["noise"]
    assert found["noise_measurements"] == ranks[0]["steps"] > 1000
    assert found["noise_grad_sq_mean"] == pytest.approx(g2, rel=0.1)
    assert found["noise_trace_sigma_mean"] == pytest.approx(tr, rel=0.1)
    assert found["noise_b_simple_mean"] == pytest.approx(tr / g2, rel=0.1)
    assert ranks[1]["noise"]["noise_b_simple_mean"] == pytest.approx(found["noise_b_simple_mean"])


def test_measuring_over_two_ranks_adds_no_backward_pass(make_cfg):
    cfg = make_cfg(*LOGISTIC, "epochs=1", "trainer.max_steps=5", "batch.size=64", "distributed=ddp",
                   "distributed.nproc_per_node=2")
    ranks = dist_workers.launch(dist_workers.train_steps, cfg)
    assert [r["backwards"] for r in ranks.values()] == [5, 5]
    assert ranks[0]["noise"]["noise_measurements"] == 5
