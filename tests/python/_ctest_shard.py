"""A pytest plugin that runs one shard of the collected tests, so that a long test file is
several ctests that run side by side (tests/python/CMakeLists.txt loads it with
`-p _ctest_shard`). TAILCUT_TEST_SHARD=K/N keeps the K-th of every N tests in collection
order (K from 1): each test runs in exactly one of the N shards, and the cases of one
parametrized test spread over them. Without the variable every test runs."""

import os

import pytest


def _shard():
    spec = os.environ.get("TAILCUT_TEST_SHARD", "")
    if not spec:
        return None
    try:
        k, n = (int(x) for x in spec.split("/"))
    except ValueError:
        k = n = 0
    if not 1 <= k <= n:
        raise pytest.UsageError(f"TAILCUT_TEST_SHARD={spec!r}: expected K/N with 1 <= K <= N, "
                                "as in 2/3 (the second of three shards)")
    return k, n


@pytest.hookimpl(trylast=True)  # after -m has deselected: shards of the tests that run
def pytest_collection_modifyitems(config, items):
    shard = _shard()
    if shard is None:
        return
    k, n = shard
    keep = [item for i, item in enumerate(items) if i % n == k - 1]
    drop = [item for i, item in enumerate(items) if i % n != k - 1]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep
