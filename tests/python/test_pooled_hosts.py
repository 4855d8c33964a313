"""PooledLoader over a queue fed by a coordinator (a redis-server of the test's own, hosts
simulated by host ids): refused at once with what to do instead, not a wait that ends in a
timeout."""

import os

import pytest

import tailcut

torch = pytest.importorskip("torch")
import tailcut.torch as tt  # noqa: E402

from _pooled_hosts import RECORD, write_ids  # noqa: E402
from test_global import REDIS, redis_url  # noqa: E402,F401 (the fixture)

pytestmark = pytest.mark.skipif(REDIS is None, reason="redis-server is not installed")


def test_a_queue_fed_by_a_coordinator_is_refused_naming_what_to_do(redis_url, tmp_path,  # noqa: F811
                                                                    qname, monkeypatch):
    """Before, the pool took it: its loaders end an epoch once the host's queue
    acked num_items items of it, a fed host acks only its share, and the ranks
    waited for an epoch end that never came (`timeout`, 1800 s by default)."""
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    path = write_ids(tmp_path / "ids.bin", 0, 400)
    ds = tt.QueueDataset([path], name=qname, format="fixed", record_bytes=RECORD, num_slices=8,
                         coordinator=redis_url, host_id="n0", on_notice=lambda line: None)
    try:
        with pytest.raises(tailcut.InvalidArgumentError,
                           match=rf"PooledLoader: queue '{qname}' is fed by a coordinator "
                                 r"\(host 'n0'\), and a pool cannot end the epochs"):
            tt.PooledLoader(ds, num_workers=1, batch_size=16, slot_bytes=1 << 13, num_slots=2,
                            timeout=5)
        assert not os.path.exists(f"/dev/shm/tailcut-ring.{os.geteuid()}.{qname}.pool")
    finally:
        ds.close()
