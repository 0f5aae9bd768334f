"""Cluster and Sentinel tests: the deployments' fixtures come from tests.redis_servers."""

from __future__ import annotations

import pytest

from tests import redis_servers


def pytest_configure(config: pytest.Config) -> None:
    # The deployments' fixtures, until tests/conftest.py lists "tests.redis_servers" in
    # ``pytest_plugins``; then this finds the plugin registered and does nothing.
    if not config.pluginmanager.is_registered(redis_servers):
        config.pluginmanager.register(redis_servers, "tests.redis_servers")
