"""Map-style datasets (``__getitem__`` and ``__len__``, as torch's Dataset and
torchvision's ImageFolder have) read by index from a tailcut index work
(WorkQueue(num_samples=N)): what both of their paths check, the per-rank
tailcut.torch.IndexDataset and the pooled PooledLoader(dataset, ...)."""

import tailcut

# Epochs of the queue behind a map-style dataset when none are given: a
# DataLoader has no number of epochs, so the queue holds enough for a long
# run (one done bit per item and epoch: 50 KB at N = 10**6).
DEFAULT_EPOCHS = 100


def _iterable_dataset(dataset):
    try:
        from torch.utils.data import IterableDataset
    except ImportError:
        return False
    return isinstance(dataset, IterableDataset)


def sample_count(dataset, who):
    """len(dataset) of a map-style dataset, or a TypeError / ValueError that
    says what `who` needs instead."""
    kind = type(dataset).__name__
    if _iterable_dataset(dataset):
        raise TypeError(
            f"{who}: the dataset ({kind}) is an IterableDataset, which has no indices to "
            f"shuffle and share out; use tailcut.torch.QueueDataset over its files instead "
            f"(docs/pytorch.md)")
    if not hasattr(type(dataset), "__getitem__"):
        raise TypeError(f"{who}: the dataset ({kind}) has no __getitem__; give a map-style "
                        f"dataset (dataset[i] for i in range(len(dataset))) or a "
                        f"tailcut.torch.QueueDataset")
    if not hasattr(type(dataset), "__len__"):
        raise TypeError(f"{who}: the dataset ({kind}) has no __len__: the queue needs the number "
                        f"of samples; define __len__, or for a stream of records use "
                        f"tailcut.torch.QueueDataset")
    n = len(dataset)
    if n == 0:
        raise ValueError(f"{who}: the dataset ({kind}) is empty (len 0); there is nothing to "
                         f"load")
    return n


def add_note(error, note):
    """Adds `note` to the exception (shown under its message in a traceback)."""
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:  # Python < 3.11
        error.args = (*error.args, note)


def load_sample(dataset, index, queue, epoch):
    """dataset[index]; an exception it raises gets a note naming the index."""
    try:
        return dataset[index]
    except Exception as e:
        add_note(e, f"tailcut: raised by dataset[{index}] ({type(dataset).__name__}, queue "
                    f"'{queue.name}', epoch {epoch})")
        raise


def index_queue_args(n, queue_options):
    """The WorkQueue arguments of an index work over n samples."""
    for key in ("works", "prefix", "format", "record_bytes"):
        if queue_options.get(key) is not None:
            raise tailcut.InvalidArgumentError(
                f"{key}= is for a queue of files; a map-style dataset is read by index (its "
                f"queue has num_samples={n})")
    args = dict(queue_options, works=None, num_samples=n)
    args.setdefault("num_epochs", DEFAULT_EPOCHS)
    return args
