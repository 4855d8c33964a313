"""Process entry points for the multi-process tests (importable by spawn)."""

import json
import os
import signal
import time

import tailcut


def take_all(name, works, num_epochs, num_clients, out_path, delay=0.0, seed=7):
    """Takes and acks items until the end; writes [(epoch, index), ...] as JSON."""
    got = []
    with tailcut.WorkQueue(works, num_epochs=num_epochs, num_clients=num_clients, name=name,
                           seed=seed, num_slices=24, on_notice=lambda line: None) as q:
        # Start together, so that only speed decides who takes what.
        deadline = time.monotonic() + 60
        while q.summary()["clients_joined"] < num_clients and time.monotonic() < deadline:
            time.sleep(0.005)
        while True:
            item = q.take()
            if item is None:
                break
            with item:
                if delay:
                    time.sleep(delay)
                got.append((item.epoch, item.index))
    with open(out_path, "w") as f:
        json.dump(got, f)


def take_some_then_die(name, works, num_epochs, num_clients, out_path, count, seed=7):
    """Acks `count` items, takes two more, reports what it acked, then SIGKILLs itself."""
    q = tailcut.WorkQueue(works, num_epochs=num_epochs, num_clients=num_clients, name=name,
                          seed=seed, num_slices=24, on_notice=lambda line: None)
    acked = []
    for _ in range(count):
        item = q.take()
        item.ack()
        acked.append((item.epoch, item.index))
    held = [q.take(), q.take()]  # never acked: must go to another process
    with open(out_path, "w") as f:
        json.dump(acked, f)
    os.kill(os.getpid(), signal.SIGKILL)
    del held


def read_records(name, works, fmt, out_path, record_bytes=None):
    """Reads every record of the queue; writes their hex strings as JSON."""
    got = []
    with tailcut.WorkQueue(works, name=name, num_slices=12, num_clients=3, format=fmt,
                           record_bytes=record_bytes, on_notice=lambda line: None) as q:
        for r in q.records(buffer_budget_bytes=16 * 4096, chunk_bytes=4096):
            got.append(bytes(r).hex())
    with open(out_path, "w") as f:
        json.dump(got, f)


def hold_items(name, works, open_kwargs, count, ready_path, release_path):
    """Takes `count` items and holds them until release_path exists (at most 60 s), then
    acks them."""
    q = tailcut.WorkQueue(works, name=name, on_notice=lambda line: None, **open_kwargs)
    items = [q.take() for _ in range(count)]
    open(ready_path, "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(release_path) and time.monotonic() < deadline:
        time.sleep(0.01)
    for item in items:
        item.ack()
    q.close()


def ack_all(name, works, open_kwargs):
    """Takes and acks every item it can get (those of a stalled process too)."""
    with tailcut.WorkQueue(works, name=name, on_notice=lambda line: None, **open_kwargs) as q:
        while (item := q.take(timeout=30)) is not None:
            item.ack()


def take_one(name, works, open_kwargs, out_path):
    """Takes one item within 10 s and writes its index (or 'empty') to out_path; acks it."""
    with tailcut.WorkQueue(works, name=name, on_notice=lambda line: None, **open_kwargs) as q:
        try:
            item = q.take(timeout=10)
            result = "end" if item is None else str(item.index)
            if item is not None:
                item.ack()
        except tailcut.Empty:
            result = "empty"
    with open(out_path, "w") as f:
        f.write(result)
