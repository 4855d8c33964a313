"""A pooled loader leaves when the job closes its ring, whatever it waits for:
an earlier epoch's item held elsewhere (the epoch gate), an item, the other
loaders. A loader that waited on was killed at the job's exit, and the
killed client made the engine keep the job's queue in /dev/shm as a crashed
run's ("a process of it died")."""

import threading
import time

import pytest

import tailcut

torch = pytest.importorskip("torch", reason="tailcut.torch needs PyTorch (python3-torch)")

from tailcut.pool._loader import RING_MAX_CLIENTS, load  # noqa: E402
from tailcut.pool._map_source import wrap  # noqa: E402


class Ids(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.tensor(i)


def test_a_loader_waiting_at_the_epoch_gate_leaves_when_the_ring_is_closed(rname):
    source = wrap(Ids(), 4, dict(name=rname, num_epochs=3, num_slices=1))
    queue = source.queue
    ring_name = rname + ".pool"
    trainer = tailcut.BatchRing(ring_name, 65536, 4, "trainer", max_clients=RING_MAX_CLIENTS)
    held = queue.take(timeout=5)  # epoch 0's one item, held here: epoch 0 never settles
    assert held.epoch == 0
    done = {}

    def loader():
        ring = tailcut.BatchRing(ring_name, 65536, 4, "loader", max_clients=RING_MAX_CLIENTS)
        try:
            done.update(load(queue, ring, source.recipe(4, None, None), lambda: False, 0.005))
        finally:
            ring.close()

    thread = threading.Thread(target=loader, daemon=True)
    thread.start()
    try:
        time.sleep(0.5)  # the loader takes epoch 1's item, hands it back, waits at the gate
        assert thread.is_alive() and not done
        trainer.end_epoch(None)  # what close() (or the rank's exit) does: the job is over
        started = time.monotonic()
        thread.join(10)
        assert not thread.is_alive(), "the loader waited on at the epoch gate of a closed ring"
        assert time.monotonic() - started < 2.0
        assert done["stopped"] == "ring closed" and done["batches"] == 0
    finally:
        held.give_back()
        thread.join(10)
        trainer.close()
        source.close()
