"""The finder's probe processes start inside a worker of Hydra's joblib launcher, whose default start
method is loky's: bsexp.finder.server.own_start_method lends multiprocessing its own default while a
child starts, and gives loky's back after (the end to end: tests/cli/test_finder_cli.py)."""

import multiprocessing

import pytest
from joblib.externals.loky.backend import context as loky_context  # registers the "loky" method

from bsexp.finder import server
from bsexp.finder.server import own_start_method


@pytest.fixture
def as_in_a_loky_worker():
    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method(loky_context.LokyContext._name, force=True)
    yield
    multiprocessing.set_start_method(before, force=True)


def _child(conn):
    conn.send(multiprocessing.get_start_method())


def test_a_forkserver_child_starts_under_loky_and_loky_is_given_back(as_in_a_loky_worker):
    assert multiprocessing.get_start_method() == "loky"
    context = multiprocessing.get_context("forkserver")
    parent, child = context.Pipe()
    # bsexp's own fork server, as the finder starts it (and stops it after): one started by the
    # Process below would lack its environment and be left to the next test of this worker.
    server.start()
    try:
        with own_start_method():
            assert multiprocessing.get_start_method() in multiprocessing.get_all_start_methods()
            process = context.Process(target=_child, args=(child,))
            process.start()
        assert parent.recv() in multiprocessing.get_all_start_methods()  # the child's own default
        process.join(timeout=60)
    finally:
        server.stop()
    assert process.exitcode == 0
    assert multiprocessing.get_start_method() == "loky"


def test_a_plain_default_is_left_alone():
    before = multiprocessing.get_start_method(allow_none=True)
    with own_start_method():
        assert multiprocessing.get_start_method(allow_none=True) == before
    assert multiprocessing.get_start_method(allow_none=True) == before
