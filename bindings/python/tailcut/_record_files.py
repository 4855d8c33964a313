"""Records of files read by number, in any order: what QueueDataset(files,
shuffle="global") reads (tailcut/record_index.h underneath).

RecordFiles numbers the records of a list of files as one data set (record
r of the set is record r - first of file f), from record indexes built once
per file and kept in a cache directory; ReadBatch is the pooled loaders'
collate_fn for such a dataset: the sample indices of a batch in, the
records read in one batched call, collated as a QueueDataset's records are.
Both pickle as their arguments (a process that unpickles one loads the
indexes from the cache), so a loader joining from another shell gets them
through the pool's description. No torch here (tailcut.torch imports this)."""

import hashlib
import json
import os

import numpy as np

from tailcut import _core

# Files whose first and last bytes samples_id() reads (spread over the list), and how many
# bytes at each end: a bounded cost at every start, however many files.
CONTENT_FILES, CONTENT_BYTES = 64, 64

# Records read in parallel: reads of different runs (files, or parts of one
# file far apart) at once, for a cold disk; with the page cache hot they are
# copies and more threads do not help on a small machine.
READ_THREADS = 1


class RecordFiles:
    """The records of `paths` in `format` ('fixed' with record_bytes,
    'lines', 'tfrecord', 'tar', 'file'), numbered 0..len - 1 in file order.

    index_dir: where record indexes are kept (None: $TAILCUT_INDEX_DIR, else
    ~/.cache/tailcut/index; "": nowhere, every process scans). on_notice:
    called with each notice line (an index rebuilt because its file changed).
    Built (indexes loaded or scanned) in the process that makes it, and again
    in a process that unpickles it; forked processes share it."""

    def __init__(self, paths, format="lines", record_bytes=None, index_dir=None,
                 on_notice=None):
        self.paths = [os.fsdecode(p) for p in paths]
        self.format = format
        self.record_bytes = record_bytes
        self.index_dir = None if index_dir is None else os.fsdecode(index_dir)
        self.on_notice = on_notice
        self._core = None
        self.core  # builds it: a bad file fails here

    @property
    def core(self):
        """The _core.RecordFiles. A forked process (a DataLoader worker, a
        pooled loader) uses its parent's: it is immutable, its mappings stay
        valid across fork, and its pages stay shared; an unpickled one is
        built anew (its indexes loaded from index_dir)."""
        if self._core is None:
            self._core = _core.RecordFiles(self.paths, self.format, self.record_bytes,
                                           cache_dir=self.index_dir, on_notice=self.on_notice)
        return self._core

    def __len__(self):
        return len(self.core)

    @property
    def files_scanned(self):
        return self.core.files_scanned

    def read(self, positions):
        """(data, offsets) of records `positions` (ints, or a 1-d (u)int64
        array): record k is data[offsets[k]:offsets[k + 1]] (uint8 and int64
        arrays)."""
        core = self._core if self._core is not None else self.core  # once per batch: no property
        return core.read(positions, READ_THREADS)

    def layout(self, positions):
        """Records `positions` as a QueueDataset batch of them is laid out:
        fixed-size records an (n, record_bytes) uint8 array, others
        (data, offsets)."""
        data, offsets = self.read(positions)
        if self.format == "fixed":
            return data.reshape(len(positions), self.record_bytes)
        return data, offsets

    def records(self, positions):
        """Records `positions` as a QueueDataset yields them one by one:
        bytes, a tar sample as WebDataset's dict (tailcut.tar_members)."""
        data, offsets = self.read(positions)
        raw = data.tobytes()
        out = [raw[offsets[k]:offsets[k + 1]] for k in range(len(positions))]
        if self.format == "tar":
            out = [_core.tar_members(r) for r in out]
        return out

    def samples_id(self):
        """What these records are, as a checkpoint must find them again: the
        format, and the files in order with their names relative to the
        files' common directory, their record counts, their sizes and the
        first and last CONTENT_BYTES of up to CONTENT_FILES of them (four
        digests, with the first and the last name to show). Not the absolute
        paths: a data set copied to another mount is the same data set. A
        JSON text (WorkQueueOptions::samples_id, which the queue
        fingerprints); samples_difference() says what differs between two."""
        paths = [os.path.abspath(p) for p in self.paths]
        top = os.path.commonpath([os.path.dirname(p) for p in paths])
        names = [os.path.relpath(p, top) for p in paths]
        sizes = [os.stat(p).st_size for p in paths]
        return json.dumps(dict(
            format=self.core.format, files=len(paths), records=len(self),
            names=_digest(names), counts=_digest(self.core.counts()), sizes=_digest(sizes),
            content=_content_digest(paths, sizes), first=names[0], last=names[-1]),
            sort_keys=True)

    def __reduce__(self):
        # on_notice is the builder's (often a bound method of a dataset): a
        # process that unpickles this prints notices itself.
        return RecordFiles, (self.paths, self.format, self.record_bytes, self.index_dir)

    def __repr__(self):
        return f"RecordFiles({len(self.paths)} files, format={self.format!r})"


def _digest(values):
    text = json.dumps(values)  # names with undecodable bytes are escaped, never lost
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _content_digest(paths, sizes):
    """A digest of the first and last CONTENT_BYTES of CONTENT_FILES files
    spread evenly over `paths` (all of them when fewer): other data under
    the same names, counts and sizes (another split of a data set written
    the same way) differs there, and a copy does not."""
    k = min(len(paths), CONTENT_FILES)
    picks = sorted({round(i * (len(paths) - 1) / max(k - 1, 1)) for i in range(k)})
    h = hashlib.sha256()
    for f in picks:
        with open(paths[f], "rb") as file:
            h.update(file.read(CONTENT_BYTES))
            if sizes[f] > CONTENT_BYTES:
                file.seek(max(CONTENT_BYTES, sizes[f] - CONTENT_BYTES))
                h.update(file.read(CONTENT_BYTES))
    return h.hexdigest()[:16]


def samples_difference(saved, here):
    """What differs between two samples_id() texts, in words (None when
    they agree): the first of format, number of files, records, the files'
    names (and order), their record counts, their sizes, their contents."""
    if saved == here:
        return None
    try:
        a, b = json.loads(saved), json.loads(here)
        a["names"], b["names"]  # noqa: B018 (a samples_id of RecordFiles)
    except (ValueError, TypeError, KeyError):
        return f"samples_id {saved!r} there, {here!r} here"
    if a["format"] != b["format"]:
        return f"format '{a['format']}' there, '{b['format']}' here"
    if a["files"] != b["files"]:
        return (f"{a['files']} files there ('{a['first']}' .. '{a['last']}'), {b['files']} "
                f"here ('{b['first']}' .. '{b['last']}')")
    if a["records"] != b["records"]:
        return f"{a['records']} records there, {b['records']} here"
    if a["names"] != b["names"]:
        if (a["first"], a["last"]) != (b["first"], b["last"]):
            return (f"other files: '{a['first']}' .. '{a['last']}' there, '{b['first']}' .. "
                    f"'{b['last']}' here (names relative to the files' common directory)")
        return (f"the files between '{a['first']}' and '{a['last']}' have other names or are "
                f"in another order")
    if a["counts"] != b["counts"]:
        return (f"the {a['files']} files hold as many records in all, but other counts per "
                f"file (another order, or records moved between files)")
    if a["sizes"] != b["sizes"]:
        return (f"the {a['files']} files have the same names and record counts but other sizes "
                f"(rewritten since)")
    return (f"the {a['files']} files have the same names, record counts and sizes but other "
            f"contents (their first and last bytes differ: another data set written the same "
            f"way, or files rewritten since)")


class ReadBatch:
    """A pooled loader's collate_fn over sample indices of a RecordFiles:
    reads them in one call, then (record_transform) transforms each record
    and collates with collate_fn, else torch's default_collate; or, with
    neither, lays them out as a QueueDataset's batch (RecordFiles.layout),
    or collate_fn(list of records)."""

    def __init__(self, records, collate_fn=None, record_transform=None):
        self.records, self.collate_fn = records, collate_fn
        self.record_transform = record_transform

    def __call__(self, indices):
        if self.record_transform is None and self.collate_fn is None:
            return self.records.layout(indices)
        records = self.records.records(indices)
        if self.record_transform is not None:
            records = [self.record_transform(r) for r in records]
            if self.collate_fn is None:
                from torch.utils.data import default_collate
                return default_collate(records)
        return self.collate_fn(records)

