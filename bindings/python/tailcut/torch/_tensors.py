"""Tensors over numpy arrays, read-only ones included, for tailcut.torch and tailcut.pool."""

import threading
import warnings

import torch

# Zero-copy batches are read-only numpy views of the reader's buffers, and
# torch.from_numpy warns about read-only arrays because torch has no read-only
# tensors. The tensors made here from such views are documented as read-only
# and valid until the next batch: nothing in tailcut writes to them, and a
# caller who wants to write asks for copy=True (owned, writable arrays). torch
# issues that warning once per process (TORCH_WARN_ONCE), so only the first
# conversion needs to silence it; later ones cannot warn. As a consequence, a
# from_numpy of a read-only array elsewhere in the process no longer warns.
_quiet_lock = threading.Lock()
_quieted = False


def from_numpy(array):
    """torch.from_numpy(array), a read-only array's warning silenced (see above)."""
    global _quieted
    if _quieted or array.flags.writeable:
        return torch.from_numpy(array)
    with _quiet_lock:  # a read-only zero-copy view: see _quieted above
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable",
                                    category=UserWarning)
            tensor = torch.from_numpy(array)
        _quieted = True
    return tensor

