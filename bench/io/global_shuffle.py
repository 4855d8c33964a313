"""Global shuffle of records (QueueDataset(files, shuffle="global")): how well
each order mixes label-sorted data, what it costs to read, and what the record
index costs to build. The tables of docs/shuffle.md.

    PYTHONPATH=build/python python3 bench/io/global_shuffle.py [--records 400000]
        [--record-bytes 128] [--repeats 3] [--skip-speed] [--speed-only]

1. Classes per batch: 20 classes x 1,000 records in 4 files written in class
   order (class c = records 1000c .. 1000c + 999), batches of 256 consecutive
   records as one process reads them; for TFRecord (8-byte records) and tar
   (a sample = one member '<id>.cls'), the worst, median and first full batch:
   file order, the item shuffle (QueueDataset's default), the global shuffle,
   and a map-style dataset through IndexDataset (the same permutation).
2. Records/s, page cache hot, one process, batches of 256: file order against
   the global shuffle (fixed-size and TFRecord records of --record-bytes, in 8
   files): --repeats runs of each, alternating, a fresh dataset each; the
   medians, their ratio, the range of the runs' ratios and the load average
   (the machine may be shared: run it again when it was busy).
3. Index build: the first tailcut.RecordFiles of the TFRecord files (an empty
   index directory: every file scanned), on one thread and on the default
   threads, against `cat files > /dev/null` of the same files, alternating,
   the page cache hot, median of max(--repeats, 5); then a second one (every
   index loaded).
"""

import argparse
import io
import os
import statistics
import subprocess
import tarfile
import tempfile
import time

import numpy as np
import torch

import tailcut
import tailcut.torch

CLASSES, PER_CLASS, FILES, BATCH = 20, 1000, 4, 256


def tfrecord(data):
    return tailcut.encode_tfrecord(data)


def write_sorted(tmp, fmt):
    """The label-sorted data set in `fmt`: 4 files of 5,000 records each."""
    per_file = CLASSES * PER_CLASS // FILES
    paths = []
    for f in range(FILES):
        ids = range(f * per_file, (f + 1) * per_file)
        path = os.path.join(tmp, f"sorted-{f}.{fmt}")
        if fmt == "tfrecord":
            with open(path, "wb") as out:
                out.write(b"".join(tfrecord(i.to_bytes(8, "little")) for i in ids))
        else:
            with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
                for i in ids:
                    data = str(i).encode()
                    info = tarfile.TarInfo(f"{i:06d}.cls")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


def record_id(record):
    return int(record["cls"]) if isinstance(record, dict) else int.from_bytes(record, "little")


class Ids(torch.utils.data.Dataset):
    """The map-style twin: sample i is record i."""

    def __len__(self):
        return CLASSES * PER_CLASS

    def __getitem__(self, i):
        return i


def classes(order):
    """(worst, median, first) classes in the full batches of `order`."""
    counts = [len({i // PER_CLASS for i in order[k:k + BATCH]})
              for k in range(0, len(order) - BATCH + 1, BATCH)]
    return min(counts), statistics.median(counts), counts[0]


def mixing_table(tmp):
    print(f"Classes per batch of {BATCH} ({CLASSES} classes x {PER_CLASS} records in "
          f"{FILES} files, class order; worst / median / first full batch)")
    print(f"{'order':58} {'tfrecord':>14} {'tar':>14}")
    rows = [
        ("file order (shuffle=False, shuffle_buffer=0, interleave=1)",
         dict(shuffle=False, shuffle_buffer=0, interleave=1)),
        ("item shuffle (shuffle=True, the default buffer 2048 x 2)", dict(shuffle=True)),
        ('global shuffle (shuffle="global")', dict(shuffle="global")),
    ]
    data = {fmt: write_sorted(tmp, fmt) for fmt in ("tfrecord", "tar")}
    for label, options in rows:
        cells = []
        for fmt, paths in data.items():
            extra = dict(index_dir=os.path.join(tmp, "index")) if options["shuffle"] == "global" else {}
            ds = tailcut.torch.QueueDataset(paths, format=fmt, seed=1, name=f"mix-{os.getpid()}",
                                            on_notice=lambda line: None, **options, **extra)
            order = [record_id(r) for r in ds]
            ds.close()
            assert sorted(order) == list(range(CLASSES * PER_CLASS)), "a record missing or twice"
            cells.append("%d / %g / %d" % classes(order))
        print(f"{label:58} {cells[0]:>14} {cells[1]:>14}")
    ds = tailcut.torch.IndexDataset(Ids(), seed=1, num_epochs=1, name=f"mix-map-{os.getpid()}",
                                    on_notice=lambda line: None)
    order = list(ds)
    ds.close()
    cell = "%d / %g / %d" % classes(order)
    print(f"{'map-style (IndexDataset, the same permutation)':58} {cell:>14} {'-':>14}")


def write_speed_data(tmp, n, record_bytes):
    """n records of record_bytes in 8 files, fixed-size and TFRecord."""
    rng = np.random.default_rng(0)
    files = {"fixed": [], "tfrecord": []}
    per_file = n // 8
    for f in range(8):
        records = rng.integers(0, 256, (per_file, record_bytes), dtype=np.uint8)
        path = os.path.join(tmp, f"speed-{f}.bin")
        records.tofile(path)
        files["fixed"].append(path)
        path = os.path.join(tmp, f"speed-{f}.tfrecord")
        with open(path, "wb") as out:
            out.write(b"".join(tfrecord(r.tobytes()) for r in records))
        files["tfrecord"].append(path)
    return files, per_file * 8


def read_rate(paths, fmt, record_bytes, n, run, **options):
    """Records/s of one epoch of a fresh QueueDataset."""
    ds = tailcut.torch.QueueDataset(
        paths, BATCH, format=fmt, record_bytes=record_bytes if fmt == "fixed" else None,
        seed=1, name=f"speed-{os.getpid()}-{run}", on_notice=lambda line: None, **options)
    start = time.perf_counter()
    got = 0
    for batch in ds:
        got += len(batch) if isinstance(batch, torch.Tensor) else len(batch[1]) - 1
    secs = time.perf_counter() - start
    ds.close()
    assert got == n, (got, n)
    return n / secs


def load():
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def speed_table(tmp, args):
    files, n = write_speed_data(tmp, args.records, args.record_bytes)
    index = os.path.join(tmp, "speed-index")
    print(f"\nRecords/s, one process, batches of {BATCH}, page cache hot ({n} records of "
          f"{args.record_bytes} B in 8 files; median of {args.repeats} runs each, alternating)")
    print(f"{'format':10} {'file order':>12} {'global':>12} {'global / file order':>20} "
          f"{'runs':>12}  load (1/5/15 min)")
    for fmt, paths in files.items():
        for p in paths:  # the page cache hot
            with open(p, "rb") as f:
                while f.read(1 << 22):
                    pass
        tailcut.RecordFiles(paths, fmt, args.record_bytes if fmt == "fixed" else None,
                            cache_dir=index)  # indexed before the timing
        before = load()
        file_order, global_order = [], []
        for run in range(args.repeats):
            file_order.append(read_rate(paths, fmt, args.record_bytes, n, run, shuffle=False,
                                        shuffle_buffer=0, interleave=1))
            global_order.append(read_rate(paths, fmt, args.record_bytes, n, run,
                                          shuffle="global", index_dir=index))
        ratios = [g / f for f, g in zip(file_order, global_order)]
        f, g = statistics.median(file_order), statistics.median(global_order)
        print(f"{fmt:10} {f:12.0f} {g:12.0f} {g / f:19.2f}x {min(ratios):6.2f}-"
              f"{max(ratios):.2f}x  {before} -> {load()}")
    return files


def index_table(tmp, files, repeats):
    """cat against a first build (a fresh index directory: every file scanned) on
    one thread and on the default (a thread per core, at most 8), alternating,
    median of `repeats`; then a second build (every index loaded)."""
    paths = files["tfrecord"]
    size = sum(os.path.getsize(p) for p in paths)
    times = {"cat": [], "scan, 1 thread": [], "scan, default threads": []}
    for r in range(repeats):
        start = time.perf_counter()
        subprocess.run(["cat", *paths], stdout=subprocess.DEVNULL, check=True)
        times["cat"].append(time.perf_counter() - start)
        for label, threads in (("scan, 1 thread", 1), ("scan, default threads", 0)):
            index = tempfile.mkdtemp(dir=tmp)
            start = time.perf_counter()
            first = tailcut.RecordFiles(paths, "tfrecord", cache_dir=index, threads=threads)
            times[label].append(time.perf_counter() - start)
            assert first.files_scanned == len(paths)
    start = time.perf_counter()
    second = tailcut.RecordFiles(paths, "tfrecord", cache_dir=index)
    again = time.perf_counter() - start
    assert second.files_scanned == 0
    cat = statistics.median(times["cat"])
    print(f"\nRecord index of {len(paths)} TFRecord files ({size / 1e6:.0f} MB, "
          f"{len(first)} records), page cache hot, median of {repeats} (min-max)")
    for label, t in times.items():
        ratio = "" if label == "cat" else f"   {statistics.median(t) / cat:.2f}x cat"
        print(f"  {label:24} {statistics.median(t) * 1e3:8.1f} ms ({min(t) * 1e3:.1f}-"
              f"{max(t) * 1e3:.1f}){ratio}")
    print(f"  second build (loaded)    {again * 1e3:8.1f} ms")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--record-bytes", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--speed-only", action="store_true",
                        help="the records/s table alone (no classes per batch, no index build)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if not args.speed_only:
            mixing_table(tmp)
        if not args.skip_speed:
            files = speed_table(tmp, args)
            if not args.speed_only:
                index_table(tmp, files, max(args.repeats, 5))


if __name__ == "__main__":
    main()
