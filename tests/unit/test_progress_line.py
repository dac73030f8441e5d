"""The line a sweep tells in a terminal after each point (bsexp.runs.sweep_progress): the points done of
the grid, how those that did not complete ended, and the time left from the points this run
trained."""

from collections import Counter

from bsexp.runs.sweep_progress import duration, progress_line


def test_the_progress_line_counts_the_grid_and_estimates_from_the_points_measured():
    # 3 of 18 done in 60 s, all trained by this run: 20 s a point, 15 left.
    assert progress_line(3, 18, Counter(completed=3), 3, 60.0) == "sweep: 3/18 points done, about 5 min left"
    # A continued sweep: 5 done before this run, 1 trained now in 30 s, so 12 left take 6 min.
    assert progress_line(6, 18, Counter(completed=1), 1, 30.0) == "sweep: 6/18 points done, about 6 min left"
    # Only points done before this run: nothing measured yet, no estimate.
    assert progress_line(5, 18, Counter(completed=5), 0, 2.0) == "sweep: 5/18 points done"
    told = progress_line(18, 18, Counter(completed=16, failed=1, diverged=1), 18, 8000.0)
    assert told == "sweep: 18/18 points done (1 diverged, 1 failed) in 2 h 13 min"
    assert progress_line(2, None, Counter(completed=2), 2, 10.0) == "sweep: 2 points done"
    assert [duration(s) for s in (0.4, 89, 90, 5399, 5400, 7500)] == [
        "0 s",
        "89 s",
        "2 min",
        "90 min",
        "1 h 30 min",
        "2 h 05 min",
    ]
