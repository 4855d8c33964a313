"""summary(), add_summary(), state_dict() and restoring a checkpoint."""

import os

import pytest

import tailcut
from tailcut import _core
from conftest import SMALL_READER, write_lines

# Written out here, not derived from the field list, so that a field dropped
# from the list and from the dicts alike is still caught.
QUEUE_FIELDS = {"name", "segment_path", "num_items", "num_epochs", "num_samples", "total", "done",
                "in_flight",
                "handed_out", "epoch", "seed", "shuffle", "num_clients", "clients_joined",
                "recovered_items", "stale_acks", "splits", "now_ns", "clients"}
CLIENT_FIELDS = {"slot", "pid", "alive", "items_taken", "items_acked", "items_given_back",
                 "items_recovered", "bytes_acked", "records", "stale_acks", "splits", "open_items",
                 "busy_ns",
                 "idle_ns", "last_progress_ns", "joined_ns"}
# The one field list (tailcut/stats_fields.h), as the module exports it: the
# dicts follow its order.
LISTED_QUEUE_FIELDS = [name for name, _, _ in _core._stats_fields["queue"]] + ["clients"]
LISTED_CLIENT_FIELDS = [name for name, _, _ in _core._stats_fields["client"]]


@pytest.fixture
def files(tmp_path):
    return [write_lines(tmp_path / f"p{i}.txt", [b"%d-%d" % (i, j) for j in range(100)])
            for i in range(5)]


class FakeWriter:
    def __init__(self):
        self.scalars = {}

    def add_scalar(self, tag, value, global_step=None):
        self.scalars[tag] = (value, global_step)


def test_summary_mirrors_queue_and_client_stats(files, qname, notices):
    with tailcut.WorkQueue(files, name=qname, num_epochs=2, seed=3, num_clients=1,
                           on_notice=notices.append) as q:
        a = q.take()
        a.ack()
        b = q.take()
        s = q.summary()
        assert set(s) == QUEUE_FIELDS
        assert list(s) == LISTED_QUEUE_FIELDS
        assert (s["name"], s["num_items"], s["num_epochs"], s["total"]) == (qname, 5, 2, 10)
        assert (s["done"], s["in_flight"], s["handed_out"], s["seed"]) == (1, 1, 2, 3)
        assert s["segment_path"] == tailcut.segment_path(qname) == q.segment_path
        assert len(s["clients"]) == 1
        c = s["clients"][0]
        assert set(c) == CLIENT_FIELDS
        assert list(c) == LISTED_CLIENT_FIELDS
        assert c["pid"] == os.getpid() and c["alive"]
        assert (c["items_taken"], c["items_acked"], c["open_items"]) == (2, 1, 1)
        assert c["bytes_acked"] == a.end - a.begin
        b.give_back()
        listed = [x for x in tailcut.list_queues() if x["name"] == qname]
        assert listed and listed[0]["valid"]
        inspected = tailcut.inspect_queue(qname)
        assert inspected["done"] == 1 and set(inspected) == QUEUE_FIELDS
        assert list(inspected) == LISTED_QUEUE_FIELDS


def test_add_summary_writes_scalars_through_the_writer(files, qname, notices):
    with tailcut.WorkQueue(files, name=qname, on_notice=notices.append) as q:
        q.take().ack()
        held = q.take()  # noqa: F841 (kept open: a dropped item is given back)
        w = FakeWriter()
        q.add_summary(w, step=17)
        assert w.scalars["tailcut/done"] == (1.0, 17)
        assert w.scalars["tailcut/in_flight"] == (1.0, 17)
        assert w.scalars["tailcut/total"] == (5.0, 17)
        assert w.scalars["tailcut/progress"] == (0.2, 17)
        slot = q.summary()["clients"][0]["slot"]
        assert w.scalars[f"tailcut/client_{slot}/items_acked"] == (1.0, 17)
        assert w.scalars[f"tailcut/client_{slot}/items_taken"] == (2.0, 17)
        assert all(isinstance(v, float) for v, _ in w.scalars.values())
        w2 = FakeWriter()
        q.add_summary(w2, prefix="data")
        assert w2.scalars["data/done"] == (1.0, None)


def series_tags(fields, prefix):
    tags = set()
    for name, series, _ in fields:
        if series == "value":
            tags.add(prefix + name)
        elif series == "seconds":
            assert name.endswith("_ns")
            tags.add(prefix + name[:-3] + "_seconds")
    return tags


def test_add_summary_writes_one_scalar_per_series_field_of_the_list(files, qname, notices):
    with tailcut.WorkQueue(files, name=qname, on_notice=notices.append) as q:
        q.take().ack()
        w = FakeWriter()
        q.add_summary(w)
        slot = q.summary()["clients"][0]["slot"]
        expected = (series_tags(_core._stats_fields["queue"], "tailcut/") |
                    series_tags(_core._stats_fields["client"], f"tailcut/client_{slot}/") |
                    {"tailcut/progress", "tailcut/clients_alive"})
        assert set(w.scalars) == expected
        assert w.scalars[f"tailcut/client_{slot}/busy_seconds"][0] >= 0


def drain(q):
    out = []
    while (item := q.take()) is not None:
        out.append((item.epoch, item.index))
        item.ack()
    return out


def test_a_restored_checkpoint_continues_exactly(files, qname, notices):
    kwargs = dict(num_epochs=3, num_slices=10, seed=11, on_notice=notices.append)
    # The order a fresh queue hands out.
    with tailcut.WorkQueue(files, name=qname + "-ref", **kwargs) as ref:
        order = drain(ref)
    assert len(order) == 30

    q = tailcut.WorkQueue(files, name=qname, **kwargs)
    first = []
    for _ in range(13):
        item = q.take()
        first.append((item.epoch, item.index))
        item.ack()
    assert first == order[:13]
    state = q.state_dict()
    assert set(state) == {"state", "name", "num_items", "num_epochs", "seed", "done", "total"}
    assert isinstance(state["state"], bytes)
    assert (state["done"], state["total"], state["seed"]) == (13, 30, 11)
    # Work after the checkpoint is lost with the job.
    q.take().ack()
    q.close()
    assert not os.path.exists(tailcut.segment_path(qname))

    with tailcut.WorkQueue(files, name=qname, restore_state=state["state"], **kwargs) as again:
        again.load_state_dict(state)  # the state it was opened with: accepted, a no-op
        assert drain(again) == order[13:]


def test_a_checkpoint_hands_out_open_items_again(files, qname, notices):
    kwargs = dict(num_epochs=1, num_slices=10, seed=5, on_notice=notices.append)
    q = tailcut.WorkQueue(files, name=qname, **kwargs)
    done = []
    for _ in range(4):
        item = q.take()
        done.append(item.index)
        item.ack()
    held = q.take()
    held.progress(held.begin)
    state = q.state_dict()
    q.close()
    assert not os.path.exists(tailcut.segment_path(qname))
    with tailcut.WorkQueue(files, name=qname + "-r", restore_state=state, **kwargs) as again:
        rest = [i for _, i in drain(again)]
    assert sorted(done + rest) == list(range(10))
    assert held.index in rest


def test_restore_state_from_another_configuration_is_config_mismatch(files, qname, notices):
    with tailcut.WorkQueue(files, name=qname, num_epochs=2, on_notice=notices.append) as q:
        state = q.state_dict()
        drain(q)
    with pytest.raises(tailcut.ConfigMismatchError, match="num_epochs"):
        tailcut.WorkQueue(files, name=qname + "-r", num_epochs=3, restore_state=state,
                          on_notice=notices.append)
    with pytest.raises(tailcut.CorruptError):
        tailcut.WorkQueue(files, name=qname + "-r", num_epochs=2, restore_state=b"garbage",
                          on_notice=notices.append)


def test_load_state_dict_explains_how_to_restore(files, qname, notices):
    with tailcut.WorkQueue(files, name=qname, on_notice=notices.append) as q:
        state = q.state_dict()
        with pytest.raises(tailcut.InvalidArgumentError, match="restore_state") as e:
            q.load_state_dict(state)
        assert "cannot jump to a checkpoint" in str(e.value)
        drain(q)


def test_records_progress_survives_a_checkpoint(tmp_path, qname, notices):
    # One big file in one item: a mid-item checkpoint resumes from the
    # reader's last progress offset, so no record is skipped.
    lines = [b"line-%05d" % i for i in range(5000)]
    path = write_lines(tmp_path / "big.txt", lines)
    q = tailcut.WorkQueue([path], name=qname, on_notice=notices.append)
    it = q.records(**SMALL_READER)
    seen = [bytes(next(it)) for _ in range(2000)]
    state = q.state_dict()
    it.close()
    q.close()
    assert not os.path.exists(tailcut.segment_path(qname))
    with tailcut.WorkQueue([path], name=qname + "-r", restore_state=state,
                           on_notice=notices.append) as again:
        rest = [bytes(r) for r in again.records(**SMALL_READER)]
    assert set(seen) | set(rest) == set(lines), "a record was skipped"
    assert rest[-1] == lines[-1] and len(rest) <= 5000 - 2000 + 4096 // 11 + 1
