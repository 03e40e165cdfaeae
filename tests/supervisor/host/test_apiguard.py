"""The API's connection cap follows the descriptor limit."""

from __future__ import annotations

import resource

import pytest

from supervisor.host.apiguard import MAX_CONNECTIONS, MIN_CONNECTIONS, GuardStats, connection_cap, uvicorn_options


@pytest.mark.parametrize(
    "soft,cap",
    [(1024, 256), (256, 64), (40, MIN_CONNECTIONS), (1 << 20, MAX_CONNECTIONS), (resource.RLIM_INFINITY, 256)],
)
def test_cap_is_a_quarter_of_the_soft_limit_within_bounds(soft: int, cap: int) -> None:
    assert connection_cap(soft) == cap


def test_options_bound_accept_bursts_and_keep_alive() -> None:
    opts = uvicorn_options(GuardStats(), soft_nofile=1024)
    assert opts["limit_concurrency"] is None and opts["backlog"] <= 128 and opts["timeout_keep_alive"] <= 10
