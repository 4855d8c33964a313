"""How a loader makes a batch of records: item_records reads a slice's
records as the queue's reader parses them; a Recipe turns them into a batch
(record_transform, collate_fn or default_collate, transform)."""

import numpy as np

from tailcut import _core
from tailcut._file_record import FileRecord

DEFAULT_BATCH_SIZE = 32


def item_records(path, begin, end, fmt, with_ends=False, item=None):
    """The records that start in [begin, end) of `path`, as bytes, for a
    queue format tag: 'fixed:<n>', 'lines' (also None or ''), 'tfrecord',
    'file' or 'tar' (each a WebDataset sample's dict, tailcut.tar_members). Parsed as the queue's reader parses them (tailcut.slice_records):
    lines lose their '\\n' and one trailing '\\r'; TFRecord CRCs are checked.
    with_ends=True: (records, ends), ends[i] the file offset just past record i.
    item: the WorkItem of the slice, to check the file is still the queue's.
    A 'file' record is a FileRecord: bytes with .path and .index (item.file,
    None without an item), so a transform learns which file it has."""
    name, _, size = (fmt or "lines").partition(":")
    got = _core.slice_records(path, begin, end, name, int(size) if size else None,
                              with_ends=with_ends, item=item)
    if name == "tar":
        # A WebDataset sample, as WebDataset hands it out: {"__key__": ..., "jpg": bytes, ...}.
        records, ends = got if with_ends else (got, None)
        records = [_core.tar_members(r) for r in records]
        return (records, ends) if with_ends else records
    if name != "file":
        return got
    # A whole file: its bytes with its path and index in works (FileRecord).
    records, ends = got if with_ends else (got, None)
    index = item.file if item is not None else None
    records = [FileRecord(r, path, index) for r in records]
    return (records, ends) if with_ends else records


def default_collate(records, fmt):
    """Fixed-size records: an (n, record_bytes) uint8 array. Other formats
    (lines, tfrecord, file): (data, offsets), uint8 and int64, record i =
    data[offsets[i]:offsets[i + 1]]."""
    if fmt and fmt.startswith("fixed:"):
        size = int(fmt.split(":", 1)[1])
        return np.frombuffer(b"".join(records), dtype=np.uint8).reshape(len(records), size)
    offsets = np.zeros(len(records) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in records], out=offsets[1:])
    return np.frombuffer(b"".join(records), dtype=np.uint8), offsets


class Recipe:
    """records -> batch: record_transform on each record, collate_fn on the
    list (default: default_collate; torch's default_collate after a
    record_transform, as a DataLoader does), then transform on the batch,
    handed over as torch tensors when `tensors` is set (what a QueueDataset
    with batch_size hands its transform)."""

    def __init__(self, batch_size, collate_fn=None, transform=None, record_transform=None,
                 tensors=False):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        self.batch_size = batch_size
        self.collate_fn, self.transform = collate_fn, transform
        self.record_transform, self.tensors = record_transform, bool(tensors)

    def build(self, records, fmt):
        if self.record_transform is not None:
            records = [self.record_transform(r) for r in records]
        if self.collate_fn is not None:
            batch = self.collate_fn(records)
        elif self.record_transform is not None:
            from torch.utils.data import default_collate as torch_collate
            batch = torch_collate(records)
        else:
            batch = default_collate(records, fmt)
        if self.tensors:
            batch = _torch_of(batch)
        if self.transform is not None:
            batch = self.transform(batch)
        return batch


def _torch_of(batch):
    from tailcut.torch._tensors import from_numpy  # read-only collated arrays: torch's warning silenced once
    if isinstance(batch, np.ndarray):
        return from_numpy(batch)
    if isinstance(batch, tuple) and all(isinstance(a, np.ndarray) for a in batch):
        return tuple(from_numpy(a) for a in batch)
    return batch


def recipe_for(dataset, batch_size=None, collate_fn=None, transform=None):
    """The recipe of a PooledLoader (or run_loader) over `dataset`: what is
    given, else what the QueueDataset was given (its batch_size; its
    transform, on batches when it batches, else on each record), so that
    replacing a DataLoader over the dataset is a one-line change. A map-style
    dataset's MapSource has its own (pool/_map_source.py)."""
    make = getattr(dataset, "recipe", None)
    if make is not None:
        return make(batch_size, collate_fn, transform)
    ds_batch = getattr(dataset, "batch_size", None)
    ds_transform = getattr(dataset, "transform", None)
    size = batch_size if batch_size is not None else (ds_batch or DEFAULT_BATCH_SIZE)
    if transform is not None or ds_transform is None:
        return Recipe(size, collate_fn, transform)
    if ds_batch is not None:
        return Recipe(size, collate_fn, ds_transform, tensors=True)
    return Recipe(size, collate_fn, record_transform=ds_transform)

