"""tailcut.torch.IndexDataset: the per-rank path for a map-style dataset.

Each DataLoader worker of each rank on the host (or the rank itself, with
num_workers=0) pulls items of one index work (WorkQueue(num_samples=
len(dataset))) and yields dataset[i] for the samples of each, in the epoch's
seeded order: every sample once per epoch across all of them, fast workers
taking more. The DataLoader batches and collates as usual."""

import multiprocessing

from torch.utils.data import IterableDataset, get_worker_info

import tailcut
from tailcut import _args, _attempts, _map_style, _pool_state
from tailcut._job import default_name as _default_name, env_int
from tailcut.torch._queue_dataset import QueueDataset


class IndexDataset(QueueDataset):
    """An IterableDataset over a map-style dataset, read by index from a tailcut queue.

    IndexDataset(dataset, *, name=None, num_epochs=None, shuffle=None,
                 seed=None, num_slices=None, num_clients=None, resume=None,
                 restore_state=None, ...the other tailcut.WorkQueue options)

    `dataset` has __getitem__ and __len__ (torch's Dataset, torchvision's
    ImageFolder, ...). The keywords are tailcut.WorkQueue's (num_epochs,
    default 100; shuffle, default True; seed; num_slices, default one item
    per 256 samples; name, default the torchrun job's; ...; None keeps the
    default), the same in every process of the job:
    each process (rank or DataLoader worker) opens the queue over
    num_samples=len(dataset) and reads the items it takes. Use it in place of
    DistributedSampler, with the DataLoader's own batching:

        loader = DataLoader(IndexDataset(ds, seed=0), batch_size=32, num_workers=2)
        for epoch in range(epochs):
            loader.dataset.set_epoch(epoch)
            for batch in EqualSteps(loader): ...

    EqualSteps(loader) gives every rank the same number of steps. An
    iteration reads one epoch (set_epoch(), else the queue's current one);
    a process with nothing left to take while others still hold items ends
    its iteration. An item is acked once its last sample was handed on;
    before each sample the process claims it, so an idle process may split
    off the unread tail of a slow one's item (parts of 8 samples at least).
    A worker that dies, or an iteration left early, gives its open item
    back: its samples are read again whole. An exception of dataset[i] propagates with a note naming i.
    """

    def __init__(self, dataset, *, name=None, num_epochs=None, shuffle=None, seed=None,
                 num_slices=None, num_clients=None, resume=None, restore_state=None,
                 max_clients=None, leases_per_client=None, attach_timeout=None,
                 lease_timeout=None, stop_timeout=None, on_notice=None, auto_ack=None,
                 keep_unfinished=None, coordinator=None, host_id=None, global_ttl=None,
                 global_block_size=None):
        IterableDataset.__init__(self)
        # The index queue's tailcut.WorkQueue options, listed (no **kwargs: an unknown keyword
        # is Python's TypeError naming IndexDataset); those not given keep WorkQueue's default.
        queue_options = {k: v for k, v in dict(
            name=name, num_epochs=num_epochs, shuffle=shuffle, seed=seed, num_slices=num_slices,
            num_clients=num_clients, restore_state=restore_state, max_clients=max_clients,
            leases_per_client=leases_per_client, attach_timeout=attach_timeout,
            lease_timeout=lease_timeout, stop_timeout=stop_timeout, on_notice=on_notice,
            auto_ack=auto_ack, keep_unfinished=keep_unfinished, coordinator=coordinator,
            host_id=host_id, global_ttl=global_ttl, global_block_size=global_block_size,
        ).items() if v is not None}
        n = _map_style.sample_count(dataset, "IndexDataset")
        self.dataset = dataset
        queue_options.setdefault("num_clients", env_int("LOCAL_WORLD_SIZE", 1))
        queue_options.setdefault("name", _default_name())
        self._queue_args = _map_style.index_queue_args(n, queue_options)
        if queue_options.get("restore_state") is not None:
            # A PooledLoader checkpoint of several hosts: this host's queue's entry.
            self._queue_args["restore_state"] = _pool_state.host_queue_state(
                queue_options["restore_state"], queue_options["name"],
                queue_options.get("host_id"))
        self.batch_size = None  # the DataLoader batches
        self.transform = None  # the dataset applies its own
        self._epoch = None
        self.batch_epoch = None
        self.late_records = 0
        self._last_epoch = {}
        self._queue = None
        self._queue_pid = None
        self._closed = False
        if resume is not None:
            _args.flag("resume", resume)
        self.resume = _attempts.resume_default(resume)
        self._resumed = None  # as QueueDataset's
        # A subclass's own split options (tailcut.pool's MapSource: whole batches), set
        # before the queue opens, since they are this process's from then on.
        self._queue_args.update(getattr(self, "_split_options", {}))
        if multiprocessing.parent_process() is None and get_worker_info() is None:
            self._resumed = _attempts.before_open(self._queue_args, self.resume)
        self.queue  # opens it: joins this process to the queue, checks the options

    def records_per_epoch(self):
        """(len(dataset), True): the samples of one epoch."""
        return self._queue_args["num_samples"], True

    def __iter__(self):
        q = self.queue
        return self._samples(q, self._next_epoch(q))

    def _samples(self, q, epoch):
        while True:
            try:
                item = q.take(timeout=0)
            except tailcut.Empty:
                return  # the rest is held by others (they come back if those die)
            if item is None:
                return
            if item.epoch > epoch:
                item.give_back()  # the next epoch's: the next iteration reads it
                return
            self.batch_epoch = item.epoch
            with item:  # acked once its last sample was handed on; given back if left early
                indices = item.indices()
                begin = item.begin
                for position in range(begin, item.end):
                    if position >= item.claim(position + 1):
                        break  # the tail from here was split off by an idle process
                    if item.epoch < epoch:
                        self.late_records += 1
                    yield _map_style.load_sample(self.dataset, indices[position - begin], q,
                                                 item.epoch)

    def __repr__(self):
        return (f"IndexDataset({type(self.dataset).__name__}, n={len(self.dataset)}, "
                f"name={self._queue_args['name']!r})")
