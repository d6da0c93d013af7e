"""Fixtures for end-to-end tests in network namespaces (root, iproute2, iptables).

`netlab` yields a `_netns.NetLab` whose namespaces start with the test module's
`NETNS_PREFIX` ("lf" when it sets none), closed however the test ends.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ._netns import NetLab, open_lab


@pytest.fixture
def netlab(request: pytest.FixtureRequest) -> Iterator[NetLab]:
    with open_lab(getattr(request.module, "NETNS_PREFIX", "lf")) as lab:
        yield lab
