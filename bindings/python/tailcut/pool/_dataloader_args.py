"""DataLoader's arguments as PooledLoader reads them: each either means what
it means in torch.utils.data.DataLoader, or is refused with a line that says
why and what to use (docs/pooled.md, "DataLoader's arguments").

The queue is the sampler: every record once per epoch across the host's
loaders, in the order of the queue's seed. A DistributedSampler is read for
its settings (shuffle, seed, drop_last, the epoch set_epoch() gave it); any
other sampler, and batch_sampler, cannot be honoured and is refused."""

import warnings

import tailcut
from tailcut import _args

_WHO = "PooledLoader"


def order(dataset, sampler, batch_sampler, shuffle, seed, generator, drop_last, world_size,
          rank):
    """(shuffle, seed, drop_last) of the job's queue from DataLoader's
    shuffle, sampler, batch_sampler, generator and drop_last, and tailcut's
    seed. shuffle=None: False, as DataLoader's default."""
    if batch_sampler is not None:
        raise tailcut.InvalidArgumentError(
            f"{_WHO}: batch_sampler= is refused: the host's work queue hands every sample out "
            f"once per epoch and the loaders batch them (batch_size=, drop_last=); drop it")
    if shuffle is not None:
        _args.flag("shuffle", shuffle)
    _args.flag("drop_last", drop_last)
    if seed is not None and generator is not None:
        raise tailcut.InvalidArgumentError(
            f"{_WHO}: seed= and generator= both set the order: give one of them")
    if seed is not None:
        _args.count("seed", seed, maximum=(1 << 64) - 1)
    if generator is not None:
        seed = seed_of(generator)
    if sampler is None:
        return bool(shuffle), seed, drop_last
    if not _is_distributed_sampler(sampler):
        raise tailcut.InvalidArgumentError(
            f"{_WHO}: sampler={type(sampler).__name__} is refused: the host's work queue is the "
            f"sampler (every sample once per epoch, fast ranks taking more); pass "
            f"shuffle=/seed= for the order, or a torch DistributedSampler, whose settings are "
            f"read")
    if shuffle is not None:
        # DataLoader's own rule: "sampler option is mutually exclusive with shuffle".
        raise tailcut.InvalidArgumentError(
            f"{_WHO}: shuffle= with sampler= is refused, as DataLoader refuses it: the "
            f"DistributedSampler's shuffle is the one read")
    if sampler.dataset is not dataset:
        raise tailcut.InvalidArgumentError(
            f"{_WHO}: sampler= is a DistributedSampler of another dataset "
            f"({type(sampler.dataset).__name__}): give it the loader's dataset")
    if world_size is not None and sampler.num_replicas != world_size:
        raise tailcut.InvalidArgumentError(
            f"{_WHO}: sampler= has num_replicas={sampler.num_replicas} but the job has "
            f"world_size={world_size} ranks: build it with the job's ranks")
    if rank is not None and sampler.rank != rank:
        raise tailcut.InvalidArgumentError(
            f"{_WHO}: sampler= has rank={sampler.rank} but this is rank {rank}")
    if generator is not None:
        raise tailcut.InvalidArgumentError(
            f"{_WHO}: generator= with a DistributedSampler is refused: its seed "
            f"({sampler.seed}) sets the order")
    return bool(sampler.shuffle), sampler.seed if seed is None else seed, \
        bool(drop_last or sampler.drop_last)


def _is_distributed_sampler(sampler):
    from torch.utils.data.distributed import DistributedSampler
    return isinstance(sampler, DistributedSampler)


def seed_of(generator):
    """The queue's seed from a torch.Generator, drawn as DataLoader draws its
    base seed: the same generator state gives the same order on every rank."""
    import torch
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {generator!r} "
                        f"({type(generator).__name__})")
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def context(multiprocessing_context):
    """Loaders are forked from the job (a dataset that cannot be pickled
    works): None and 'fork' are accepted, other start methods refused."""
    if multiprocessing_context is None:
        return
    method = multiprocessing_context
    if not isinstance(method, str):
        get = getattr(method, "get_start_method", None)
        if get is None:
            raise TypeError(f"multiprocessing_context must be a str, a multiprocessing context "
                            f"or None, got {method!r} ({type(method).__name__})")
        method = get()
    if method != "fork":
        raise tailcut.InvalidArgumentError(
            f"{_WHO}: multiprocessing_context={method!r} is refused: the host's loaders are "
            f"forked from local rank 0 (pass None or 'fork')")


def workers(num_workers, loaders_per_host, local_world_size):
    """(host loaders, in_process): num_workers is per rank as in DataLoader,
    so the host runs num_workers x local ranks; loaders_per_host (an int,
    (min, max) or an Autoscale) overrides it. num_workers=0 without
    loaders_per_host loads in each rank's own process (in_process)."""
    if isinstance(num_workers, (tuple, list)) or type(num_workers).__name__ == "Autoscale":
        raise TypeError(
            f"{_WHO}: num_workers is per rank, an int, as in DataLoader; got {num_workers!r}: "
            f"an autoscaling range is loaders_per_host=(min, max) (num_workers was the "
            f"host's count before)")
    num_workers = _args.count("num_workers", num_workers)
    if loaders_per_host is None:
        return num_workers * local_world_size, num_workers == 0
    if num_workers:
        raise tailcut.InvalidArgumentError(
            f"{_WHO}: num_workers={num_workers} (per rank) and loaders_per_host="
            f"{loaders_per_host!r} (the host's) both set the pool: give one of them")
    return loaders_per_host, False


def prefetch(prefetch_factor, persistent_workers):
    """Batches made ahead per loader (DataLoader's prefetch_factor, default
    2). persistent_workers is checked only: the pool's loaders always outlive
    an epoch (they are the host's, not the iteration's)."""
    _args.flag("persistent_workers", persistent_workers)
    if prefetch_factor is None:
        return 2
    return _args.count("prefetch_factor", prefetch_factor, minimum=1)


def pinning(pin_memory, pin_memory_device):
    """Whether batches are copied into pinned memory: pin_memory=True where
    CUDA is available; elsewhere a warning, as DataLoader gives."""
    _args.flag("pin_memory", pin_memory)
    _args.text("pin_memory_device", pin_memory_device)
    if pin_memory_device not in ("", "cuda") and not pin_memory_device.startswith("cuda:"):
        raise tailcut.InvalidArgumentError(
            f"{_WHO}: pin_memory_device={pin_memory_device!r} is refused: batches are pinned "
            f"for CUDA ('' or 'cuda')")
    if not pin_memory:
        return False
    import torch
    if not torch.cuda.is_available():
        warnings.warn("PooledLoader: pin_memory=True but no CUDA device is available: batches "
                      "are not pinned", stacklevel=5)
        return False
    return True


def timeout(value):
    """DataLoader's timeout: 0 (or None) waits for ever; else the seconds a rank waits
    for a batch before it raises."""
    s = _args.seconds("timeout", value, allow_none=True)
    return None if s == 0 else s
