"""QueueDataset(files, shuffle="global"): the records of all files in one seeded
permutation (an index work over the records' numbers, read through record indexes kept in a
cache). Every record once per epoch, per rank, in DataLoader workers and pooled; label-sorted
files mixed in every batch; the same order for the same seed in every process; indexes kept,
reused and rebuilt when their file changed; damaged files named; tar samples; a pooled
checkpoint restored in one call."""

import collections
import io
import json
import os
import subprocess
import sys
import tarfile
import time

import numpy as np
import pytest

import tailcut
from conftest import write_tfrecords

torch = pytest.importorskip("torch", reason="tailcut.torch needs PyTorch (python3-torch)")
from torch.utils.data import DataLoader  # noqa: E402

import tailcut.torch as tt  # noqa: E402
import tailcut.pool  # noqa: E402

CLASSES, PER_CLASS, FILES = 20, 1000, 4


@pytest.fixture(autouse=True)
def one_rank(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)


def sorted_ids(tmp_path):
    """20 classes x 1000 records of 8 bytes (an int64 id; class = id // 1000) in 4 files,
    in class order: the label-sorted data set of docs/shuffle.md."""
    paths = []
    per_file = CLASSES * PER_CLASS // FILES
    for f in range(FILES):
        path = tmp_path / f"part-{f}.bin"
        np.arange(f * per_file, (f + 1) * per_file, dtype="<i8").tofile(path)
        paths.append(str(path))
    return paths


def ids_of(batch):
    return batch.contiguous().view(torch.int64).reshape(-1).tolist()


def test_every_record_once_per_epoch_and_every_full_batch_holds_19_of_20_classes(
        tmp_path, qname):
    ds = tt.QueueDataset(sorted_ids(tmp_path), 256, format="fixed", record_bytes=8,
                         shuffle="global", seed=3, num_epochs=2, name=qname,
                         index_dir=tmp_path / "index")
    assert ds.records_per_epoch() == (CLASSES * PER_CLASS, True)
    orders = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        order, worst = [], CLASSES
        for batch in ds:
            ids = ids_of(batch)
            order += ids
            if len(ids) == 256:
                worst = min(worst, len({i // PER_CLASS for i in ids}))
        assert sorted(order) == list(range(CLASSES * PER_CLASS))  # each once
        assert worst >= 19, worst
        orders.append(order)
    assert orders[0] != orders[1]  # each epoch its own permutation
    ds.close()


def test_item_shuffle_of_the_same_files_mixes_far_less(tmp_path, qname):
    """The contrast the global shuffle exists for (docs/shuffle.md's table)."""
    ds = tt.QueueDataset(sorted_ids(tmp_path), 256, format="fixed", record_bytes=8, seed=3,
                         shuffle=True, name=qname)
    worst = min(len({i // PER_CLASS for i in ids_of(b)}) for b in ds if len(b) == 256)
    ds.close()
    assert worst < 19, worst


def order_in_a_process(tmp_path, name, seed):
    code = (
        "import sys, tailcut.torch as tt\n"
        "paths, name, seed, index = sys.argv[1:-3], sys.argv[-3], int(sys.argv[-2]), "
        "sys.argv[-1]\n"
        "ds = tt.QueueDataset(paths, format='fixed', record_bytes=8, shuffle='global', "
        "seed=seed, name=name, index_dir=index)\n"
        "print(' '.join(str(int.from_bytes(r, 'little')) for r in ds))\n"
        "ds.close()\n")
    out = subprocess.run([sys.executable, "-c", code, *sorted_ids(tmp_path), name, str(seed),
                          str(tmp_path / "index")], capture_output=True, text=True, timeout=120,
                         check=True)
    return [int(x) for x in out.stdout.split()]


def test_the_same_seed_gives_the_same_order_in_every_process(tmp_path, qname):
    a = order_in_a_process(tmp_path, qname + "a", 11)
    b = order_in_a_process(tmp_path, qname + "b", 11)
    c = order_in_a_process(tmp_path, qname + "c", 12)
    assert sorted(a) == list(range(CLASSES * PER_CLASS))
    assert a == b
    assert a != c


def test_small_items_and_batches_spanning_many_of_them_read_every_record_once(tmp_path, qname):
    ds = tt.QueueDataset(sorted_ids(tmp_path), 300, format="fixed", record_bytes=8,
                         shuffle="global", num_slices=2000, leases_per_client=40, name=qname,
                         index_dir=tmp_path / "index")
    ids = [i for batch in ds for i in ids_of(batch)]
    ds.close()
    assert sorted(ids) == list(range(CLASSES * PER_CLASS))


def test_dataloader_workers_read_every_record_once(tmp_path, qname):
    ds = tt.QueueDataset(sorted_ids(tmp_path), 100, format="fixed", record_bytes=8,
                         shuffle="global", seed=1, name=qname, index_dir=tmp_path / "index")
    seen = collections.Counter()
    for batch in DataLoader(ds, batch_size=None, num_workers=2):
        seen.update(ids_of(batch))
    ds.close()
    assert set(seen) == set(range(CLASSES * PER_CLASS)) and set(seen.values()) == {1}


def test_lines_and_tfrecord_give_the_records_of_file_order(tmp_path, qname):
    lines = [f"line {i} of {'x' * (i % 17)}".encode() for i in range(3000)]
    text = [tmp_path / f"t{f}.txt" for f in range(3)]
    for f, path in enumerate(text):
        path.write_bytes(b"".join(line + b"\r\n" * (i % 2) + b"\n" * (1 - i % 2)
                                  for i, line in enumerate(lines[f::3])))
    records = [os.urandom(i % 300) for i in range(2000)]
    tf = [write_tfrecords(tmp_path / f"r{f}.tfrecord", records[f::2]) for f in range(2)]
    for paths, fmt, want in ((text, "lines", lines), (tf, "tfrecord", records)):
        ds = tt.QueueDataset(paths, format=fmt, shuffle="global", seed=2,
                             name=f"{qname}-{fmt}", index_dir=tmp_path / "index")
        got = list(ds)
        ds.close()
        assert sorted(got) == sorted(want)
        assert got != [r for path_records in (want[f::len(paths)] for f in range(len(paths)))
                       for r in path_records]  # not file order


def test_indexes_are_kept_reused_and_rebuilt_with_a_notice_when_a_file_changed(
        tmp_path, qname, notices):
    paths = [write_tfrecords(tmp_path / f"r{f}.tfrecord", [b"a" * f, b"b", b"c"])
             for f in range(3)]
    index = tmp_path / "index"

    def open_it(suffix):
        return tt.QueueDataset(paths, format="tfrecord", shuffle="global", name=qname + suffix,
                               index_dir=index, on_notice=notices.append)

    first = open_it("1")
    assert first._records.files_scanned == 3
    assert len(os.listdir(index)) == 3
    first.close()
    second = open_it("2")
    assert second._records.files_scanned == 0  # a second run pays nothing
    second.close()
    assert not [n for n in notices if "record index" in n], notices
    write_tfrecords(paths[1], [b"a", b"b", b"c", b"d"])
    os.utime(paths[1], ns=(time.time_ns(), time.time_ns() + 10**9))
    third = open_it("3")
    assert third._records.files_scanned == 1
    assert len(third) == 10
    assert sorted(third) == sorted([b"", b"b", b"c", b"a", b"b", b"c", b"d", b"aa", b"b", b"c"])
    third.close()
    rebuilt = [n for n in notices if "record index" in n]
    assert len(rebuilt) == 1 and paths[1] in rebuilt[0], notices
    assert "changed since it was indexed" in rebuilt[0] and "mtime" in rebuilt[0], notices


def test_the_index_dir_defaults_to_tailcut_index_dir(tmp_path, qname, monkeypatch):
    monkeypatch.setenv("TAILCUT_INDEX_DIR", str(tmp_path / "from-env"))
    paths = [write_tfrecords(tmp_path / "r.tfrecord", [b"x", b"y"])]
    ds = tt.QueueDataset(paths, format="tfrecord", shuffle="global", name=qname)
    ds.close()
    assert len(os.listdir(tmp_path / "from-env")) == 1


def test_a_damaged_file_is_an_error_naming_file_and_offset(tmp_path, qname):
    path = write_tfrecords(tmp_path / "bad.tfrecord", [b"first", b"second record"])
    good = open(path, "rb").read()
    second = 12 + 5 + 4
    where = rf"bad\.tfrecord' at offset {second}"
    damaged = bytearray(good)
    damaged[second + 2] ^= 1  # a byte of the second record's length: the index refuses it
    open(path, "wb").write(bytes(damaged))
    with pytest.raises(tailcut.CorruptError, match=where):
        tt.QueueDataset([path], format="tfrecord", shuffle="global", name=qname,
                        index_dir=tmp_path / "index")
    damaged = bytearray(good)
    damaged[second + 12 + 2] ^= 1  # a byte of its data: the read refuses it
    open(path, "wb").write(bytes(damaged))
    ds = tt.QueueDataset([path], format="tfrecord", shuffle="global", name=qname,
                         index_dir=tmp_path / "index")
    with pytest.raises(tailcut.CorruptError, match=where):
        list(ds)
    ds.close()


def test_a_file_truncated_after_indexing_is_an_error_naming_it(tmp_path, qname):
    paths = sorted_ids(tmp_path)
    ds = tt.QueueDataset(paths, 64, format="fixed", record_bytes=8, shuffle="global",
                         name=qname)
    os.truncate(paths[2], 800)
    with pytest.raises(tailcut.Error, match="part-2.bin"):
        list(ds)
    ds.close()


def test_bad_arguments_are_refused(tmp_path, qname):
    paths = sorted_ids(tmp_path)
    with pytest.raises(tailcut.InvalidArgumentError, match="'global'"):
        tt.QueueDataset(paths, format="fixed", record_bytes=8, shuffle="globl", name=qname)
    with pytest.raises(tailcut.InvalidArgumentError, match="index_dir= is for"):
        tt.QueueDataset(paths, format="fixed", record_bytes=8, index_dir=tmp_path, name=qname)
    with pytest.raises(tailcut.InvalidArgumentError, match="leases_per_client=32"):
        tt.QueueDataset(paths, 256, format="fixed", record_bytes=8, shuffle="global",
                        num_slices=CLASSES * PER_CLASS, name=qname, index_dir=tmp_path / "i")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(tailcut.InvalidArgumentError, match="hold no records"):
        tt.QueueDataset([empty], shuffle="global", name=qname, index_dir=tmp_path / "i")


def write_shard(path, first, n):
    written = {}
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(first, first + n):
            key = f"train/{i:06d}"
            for suffix, data in (("jpg", os.urandom(50 + i % 700)), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"{key}.{suffix}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                written.setdefault(key, {})[suffix] = data
    return written


def test_tar_samples_are_shuffled_globally_as_webdataset_dicts(tmp_path, qname):
    written = {}
    shards = []
    for s in range(3):
        shards.append(str(tmp_path / f"shard-{s}.tar"))
        written.update(write_shard(shards[-1], s * 100, 100))
    ds = tt.QueueDataset(shards, format="tar", shuffle="global", seed=4, name=qname,
                         index_dir=tmp_path / "index")
    got = list(ds)
    ds.close()
    assert sorted(s["__key__"] for s in got) == sorted(written)
    for sample in got:
        assert {k: v for k, v in sample.items() if k != "__key__"} == written[sample["__key__"]]
    first_shards = [int(s["__key__"][-6:]) // 100 for s in got[:32]]
    assert len(set(first_shards)) == 3, first_shards  # mixed across shards from the start


def test_tar_records_per_epoch_counts_samples_not_lines(tmp_path, qname):
    """The item shuffle's buffer is sized from records_per_epoch(): a tar shard's estimate
    comes from its samples (it counted newlines in tar headers, a few per shard)."""
    shards = []
    for s in range(3):
        shards.append(str(tmp_path / f"shard-{s}.tar"))
        write_shard(shards[-1], s * 100, 100)
    ds = tt.QueueDataset(shards, format="tar", name=qname)
    records, exact = ds.records_per_epoch()
    ds.close()
    assert not exact and 300 <= records <= 330, records


def decode(sample):
    return int(sample["cls"])


def test_pooled_tar_with_a_decoding_transform(tmp_path, rname):
    shards = []
    for s in range(2):
        shards.append(str(tmp_path / f"shard-{s}.tar"))
        write_shard(shards[-1], s * 150, 150)
    ds = tt.QueueDataset(shards, format="tar", transform=decode, shuffle="global", seed=1,
                         name=rname, index_dir=tmp_path / "index")
    loader = tailcut.pool.PooledLoader(ds, batch_size=16, num_workers=2, rank=0, world_size=1,
                             local_rank=0, timeout=60, slot_bytes=1 << 14, num_slots=4)
    try:
        ids = [i for batch in loader for i in batch.tolist()]
    finally:
        loader.close()
        ds.close()
    assert sorted(ids) == list(range(300))


def pooled(paths, name, tmp_path, **kw):
    ds = tt.QueueDataset(paths, 64, format="fixed", record_bytes=8, shuffle="global", seed=9,
                         num_epochs=1, name=name, index_dir=tmp_path / "index")
    return tailcut.pool.PooledLoader(ds, loaders_per_host=2, rank=0, world_size=1, local_rank=0, timeout=60,
                           slot_bytes=1 << 14, num_slots=4, **kw), ds


def test_pooled_loaders_mix_every_batch_and_a_one_call_restore_loses_nothing(tmp_path, rname):
    paths = sorted_ids(tmp_path)
    first, ds = pooled(paths, rname, tmp_path)
    seen, worst = [], CLASSES
    try:
        for step, batch in enumerate(first):
            ids = ids_of(batch)
            seen += ids
            if len(ids) == 64:
                worst = min(worst, len({i // PER_CLASS for i in ids}))
            if step == 40:
                state = first.state_dict()
                break
    finally:
        first.close()
        ds.close()  # the job's process ends: its queue is gone, the checkpoint is left
    assert not os.path.exists(tailcut.segment_path(rname))
    assert worst >= 14, worst  # 64 of 20 classes: a uniform draw misses 6 with p < 1e-4
    again, ds = pooled(paths, rname, tmp_path)
    try:
        again.load_state_dict(state)  # one call: the loader built as in the first run
        rest = [i for batch in again for i in ids_of(batch)]
    finally:
        again.close()
        ds.close()
    counts = collections.Counter(seen + rest)
    assert set(counts) == set(range(CLASSES * PER_CLASS))  # none lost
    # As for a map-style dataset (docs/pooled.md): at most a batch per loader twice.
    assert sum(counts.values()) - CLASSES * PER_CLASS <= 64 * 2


def test_a_loader_from_another_shell_reads_the_records_by_number(tmp_path, rname):
    """`python3 -m tailcut.pool` joins with the pool's description: the recipe's ReadBatch,
    unpickled there, loads the indexes from index_dir and reads each batch's records."""
    import pathlib
    paths = sorted_ids(tmp_path)
    ds = tt.QueueDataset(paths, 100, format="fixed", record_bytes=8, shuffle="global", seed=2,
                         num_epochs=1, name=rname, index_dir=tmp_path / "index")
    loader = tailcut.pool.PooledLoader(ds, loaders_per_host=0, rank=0, world_size=1, local_rank=0,
                             timeout=60, slot_bytes=1 << 14, num_slots=4)
    try:
        loader.start_loaders()  # what the first iteration does: describes the pool
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(pathlib.Path(tailcut.__file__).resolve().parents[1]),
             str(pathlib.Path(__file__).parent)]))
        cli = subprocess.Popen([sys.executable, "-m", "tailcut.pool", "--ring", loader.name],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ids = [i for batch in loader for i in ids_of(batch)]
        _, err = cli.communicate(timeout=60)
    finally:
        loader.close()
        ds.close()
    assert cli.returncode == 0, err
    assert sorted(ids) == list(range(CLASSES * PER_CLASS))
    assert "published 200 batches, 20000 records" in err, err


# ---- The files are the queue's configuration: a checkpoint of other files is refused ---------


def write_ids(directory, names, first=0):
    """Files `names` in `directory` of 5000 8-byte ids each, from `first` on."""
    paths = []
    for f, name in enumerate(names):
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        np.arange(first + f * 5000, first + (f + 1) * 5000, dtype="<i8").tofile(path)
        paths.append(str(path))
    return paths


def global_ids(paths, name, tmp_path, **kw):
    return tt.QueueDataset(paths, 500, format="fixed", record_bytes=8, shuffle="global",
                           seed=7, num_epochs=2, name=name, index_dir=tmp_path / "index", **kw)


def test_a_checkpoint_of_other_files_with_as_many_records_is_refused_naming_what_differs(
        tmp_path, qname):
    """Records are numbered over the files in their order, so a queue state of 20,000
    records restored onto other files of 20,000 records would read other records. Before,
    the queue's fingerprint covered only their number and every restore below was taken."""
    names = [f"part-{f}.bin" for f in range(4)]
    paths = write_ids(tmp_path / "data", names)
    ds = global_ids(paths, qname, tmp_path)
    state = ds.queue.state_dict()
    ds.close()
    assert json.loads(state["samples_id"])["files"] == 4
    refused = [
        (write_ids(tmp_path / "other", [f"b-{f}.bin" for f in range(4)], first=10**6),
         r"other files: 'part-0.bin' \.\. 'part-3.bin' there, 'b-0.bin' \.\. 'b-3.bin' here"),
        ([paths[0], paths[2], paths[1], paths[3]],
         r"the files between 'part-0.bin' and 'part-3.bin' have other names or are in another "
         r"order"),
        (write_ids(tmp_path / "more", ["part-0.bin", "part-1.bin"], first=0)
         + write_ids(tmp_path / "more" / "x", ["part-2.bin"]) + [paths[3]],
         "other files"),
        # Another data set written the same way: the same names, counts and sizes.
        (write_ids(tmp_path / "val", names, first=10**6),
         "the 4 files have the same names, record counts and sizes but other contents"),
    ]
    for other, what in refused:
        with pytest.raises(tailcut.ConfigMismatchError, match=(
                r"QueueDataset: the checkpoint is of other record files than these: " + what
                + r".*restore it onto the same files in the same order")):
            global_ids(other, qname, tmp_path, restore_state=state)
    # The queue state's bytes alone: the engine refuses them by the fingerprint.
    with pytest.raises(tailcut.ConfigMismatchError, match="samples_id"):
        global_ids(refused[0][0], qname, tmp_path, restore_state=state["state"])
    assert not os.path.exists(tailcut.segment_path(qname))


def test_a_live_queue_of_other_files_is_refused(tmp_path, qname):
    paths = write_ids(tmp_path / "data", ["a.bin", "b.bin"])
    other = write_ids(tmp_path / "data", ["c.bin", "d.bin"], first=10**6)
    with global_ids(paths, qname, tmp_path):
        with pytest.raises(tailcut.ConfigMismatchError, match="the samples differ"):
            global_ids(other, qname, tmp_path)


def test_a_checkpoint_restores_onto_the_same_files_moved_to_another_directory(tmp_path, qname):
    """What identifies the data set is the files' names from their common directory, their
    order, record counts and sizes, not their absolute paths: a copy on another mount
    restores. Epoch 0 read, the state saved, the copy reads epoch 1: every record once."""
    names = [f"d/part-{f}.bin" for f in range(3)] + ["e/part-3.bin"]
    paths = write_ids(tmp_path / "data", names)
    ds = global_ids(paths, qname, tmp_path)
    ds.set_epoch(0)
    first = [i for batch in ds for i in ids_of(batch)]
    state = ds.queue.state_dict()
    ds.close()
    copies = write_ids(tmp_path / "mnt" / "copy", names)
    ds = global_ids(copies, qname, tmp_path, restore_state=state)
    ds.set_epoch(1)
    second = [i for batch in ds for i in ids_of(batch)]
    ds.close()
    assert sorted(first) == sorted(second) == list(range(20000))


def test_a_pooled_checkpoint_of_other_files_is_refused_by_the_one_call_restore(
        tmp_path, rname):
    paths = sorted_ids(tmp_path)
    first, ds = pooled(paths, rname, tmp_path)
    try:
        for step, batch in enumerate(first):
            if step == 5:
                state = first.state_dict()
                break
    finally:
        first.close()
        ds.close()
    other = write_ids(tmp_path / "other", [f"c-{f}.bin" for f in range(4)], first=10**6)
    again, ds = pooled(other, rname, tmp_path)
    try:
        with pytest.raises(tailcut.ConfigMismatchError, match=(
                r"PooledLoader.load_state_dict\(\): the checkpoint is of other record files "
                r"than these: other files: 'part-0.bin' \.\. 'part-3.bin' there, 'c-0.bin' \.\. "
                r"'c-3.bin' here")):
            again.load_state_dict(state)
        assert not again.queue.summary()["handed_out"]  # the fresh queue, untouched
    finally:
        again.close()
        ds.close()


def test_records_read_by_an_array_of_numbers_are_those_of_the_list(tmp_path):
    """RecordFiles.read takes a batch's numbers as one (u)int64 array (no Python int per
    record), as the global shuffle passes them; the same records as a list gives."""
    files = tailcut.RecordFiles(sorted_ids(tmp_path), "fixed", 8, cache_dir=str(tmp_path / "i"))
    numbers = [19_999, 3, 7_000, 3, 12_345]
    want = files.read(numbers)[0].view("<i8").tolist()
    assert want == numbers  # each record is its id
    for array in (np.array(numbers, np.uint64), np.array(numbers, np.int64),
                  np.repeat(np.array(numbers, np.uint64), 2)[::2]):
        data, offsets = files.read(array)
        assert data.view("<i8").tolist() == numbers and offsets.tolist() == list(range(0, 48, 8))
    with pytest.raises(tailcut.InvalidArgumentError, match="record -1 is out of range"):
        files.read(np.array([1, -1], np.int64))
    with pytest.raises(tailcut.InvalidArgumentError, match="record 20000 is out of range"):
        files.read(np.array([20_000], np.uint64))
