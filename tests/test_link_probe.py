"""The link probe's line (heterps_cli.profiling.links.fit_link): a latency and a bandwidth through the mean
all-reduce times of several sizes, each size's error relative to its time."""

from __future__ import annotations

import pytest

from heterps_cli.profiling.links import fit_link

SIZES = [4096, 65536, 262144, 1 << 20, 4 << 20, 16 << 20]


def test_points_on_a_line_give_its_latency_and_bandwidth():
    latency, bandwidth = fit_link([(n, 1.3e-3 + n / 1.5e9) for n in SIZES])
    assert latency == pytest.approx(1.3e-3, rel=1e-9) and bandwidth == pytest.approx(1.5e9, rel=1e-9)


def test_every_size_counts_relative_to_its_time():
    """1 ms too much on 16 MiB's 12 ms moves the line less than 0.1 ms too much on 4 KiB's 1 ms would:
    each point is weighed by its own time, so the small sizes still decide the latency."""
    exact = {n: 1e-3 + n / 1.5e9 for n in SIZES}
    late_big, _ = fit_link([(n, t + (1e-3 if n == SIZES[-1] else 0.0)) for n, t in exact.items()])
    late_small, _ = fit_link([(n, t + (1e-4 if n == SIZES[0] else 0.0)) for n, t in exact.items()])
    assert abs(late_big - 1e-3) < abs(late_small - 1e-3)
    # by hand: only the 16 MiB point off, by a tenth of its time, moves the latency under 5%
    assert late_big == pytest.approx(1e-3, rel=0.05)


def test_a_line_that_comes_out_negative_falls_back_to_the_ends():
    """Times that fall with size (a slow spell over the small ones) fit a negative bandwidth: the smallest
    size's time is then the latency and the largest's bytes beyond it the bandwidth, or its bytes over
    its time where it is not beyond."""
    latency, bandwidth = fit_link([(4096, 2e-3), (1 << 20, 1e-3), (16 << 20, 12e-3)])
    assert latency > 0 and bandwidth > 0
    latency, bandwidth = fit_link([(4096, 5e-3), (16 << 20, 4e-3)])
    assert latency == 5e-3 and bandwidth == pytest.approx((16 << 20) / 4e-3)
