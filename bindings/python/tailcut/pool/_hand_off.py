"""What a PooledLoader hands the caller: batches the caller owns, as
DataLoader's are. A batch decoded from a ring slot is a view of shared
memory that the next batch reuses; owned() copies its tensors out (into
pinned memory with pin_memory=True: the copy DataLoader's pin_memory makes
anyway). zero_copy=True skips the copy: the views are then valid until the
next batch is requested (docs/pooled.md, "Zero-copy batches")."""

import torch


def owned(batch, pin=False):
    """`batch` (a tensor, or a tuple, list or dict of them, nested; other
    leaves kept as they are) with every tensor copied into memory of its own,
    pinned when `pin`."""
    if isinstance(batch, torch.Tensor):
        out = torch.empty(batch.shape, dtype=batch.dtype, pin_memory=pin)
        return out.copy_(batch)
    if isinstance(batch, dict):
        return type(batch)((k, owned(v, pin)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(owned(v, pin) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(owned(v, pin) for v in batch)
    return batch


def pinned(batch):
    """`batch` with every tensor in pinned memory: a batch already owned
    (joined units, a carried leftover) is pinned with one more copy."""
    if isinstance(batch, torch.Tensor):
        return batch if batch.is_pinned() else batch.pin_memory()
    if isinstance(batch, dict):
        return type(batch)((k, pinned(v)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(pinned(v) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(pinned(v) for v in batch)
    return batch
