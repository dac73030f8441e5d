"""The share of the cores a run takes beside the machine's other bsexp runs (bsexp.system.cores)."""

import fcntl

from bsexp.system.cores import Entry, Sharing
from bsexp.system.registry import choose_openmp_waiting


def share(cores: int, pid: int, ceiling: int, *others: Entry) -> int:
    return Sharing(cores, ceiling, others).fair(pid, ceiling)


def test_runs_that_share_split_the_cores_evenly_an_odd_core_to_the_earliest():
    assert share(2, 10, 2) == 2  # alone: torch's default
    assert share(2, 10, 2, Entry(11, 2, True)) == 1
    assert share(2, 11, 2, Entry(10, 1, True)) == 1  # whatever the other holds now: it moves too
    assert share(3, 10, 3, Entry(11, 3, True)) == 2 and share(3, 11, 3, Entry(10, 3, True)) == 1
    assert share(16, 12, 16, Entry(10, 8, True), Entry(11, 8, True)) == 5
    assert share(16, 10, 16, Entry(11, 8, True), Entry(12, 8, True)) == 6


def test_pinned_runs_keep_their_cores_and_a_share_is_at_least_one_thread_and_at_most_the_ceiling():
    assert share(2, 10, 2, Entry(11, 1, False)) == 1
    assert share(8, 10, 8, Entry(11, 2, False), Entry(12, 3, True)) == 3  # (8 - 2) / 2
    assert share(2, 10, 2, Entry(11, 2, False)) == 1  # nothing left: one thread, not none
    assert share(2, 10, 2, Entry(11, 1, True), Entry(12, 1, True)) == 1  # 3 runs on 2 cores
    assert share(16, 10, 8) == 8  # a DDP worker of two on 16 cores: its half of the node at most
    assert share(16, 10, 1, Entry(11, 1, True)) == 1


def test_the_warning_counts_every_other_run_and_advises_an_even_split():
    sharing = Sharing(2, 2, (Entry(11, 2, False),))
    assert sharing.oversubscribed and sharing.share == 1
    assert sharing.describe() == "1 other bsexp run trains on this machine's 2 cores"
    assert Sharing(4, 2, (Entry(11, 1, True), Entry(12, 1, False))).describe() == (
        "2 other bsexp runs train on this machine's 4 cores"
    )
    assert not Sharing(4, 2, (Entry(11, 2, True),)).oversubscribed


def test_openmps_waiting_is_passive_only_beside_another_live_run_and_a_users_value_is_kept(tmp_path):
    environ: dict[str, str] = {}
    assert choose_openmp_waiting(environ, tmp_path) == "default" and environ == {}
    (tmp_path / "999999999").write_text("2 shares")  # a dead process's entry: nobody holds its lock
    assert choose_openmp_waiting(environ, tmp_path) == "default" and environ == {}
    with open(tmp_path / "1", "w") as entry:  # a live one (this process holds the lock for it)
        fcntl.flock(entry, fcntl.LOCK_EX)
        entry.write("2 shares")
        entry.flush()
        assert choose_openmp_waiting(environ, tmp_path) == "PASSIVE"
        assert environ == {"OMP_WAIT_POLICY": "PASSIVE"}
        told = {"OMP_WAIT_POLICY": "active"}
        assert choose_openmp_waiting(told, tmp_path) == "active" and told == {"OMP_WAIT_POLICY": "active"}
