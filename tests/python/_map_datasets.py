"""Map-style datasets for tests/python/test_map_style_pool.py, in a module so that a loader
started with `python3 -m tailcut.pool` can import them by reference."""

import os
import signal
import time


class Labelled:
    """Sample i: (a float32 tensor [i, i], label i % 10); `delay` seconds per sample."""

    def __init__(self, n, delay=0.0):
        self.n, self.delay = n, delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch
        if self.delay:
            time.sleep(self.delay)
        return torch.tensor([float(i), float(i)]), i % 10


class Records(Labelled):
    """Sample i: a dict with a tensor, nested plain values and a tuple."""

    def __getitem__(self, i):
        import torch
        return {"x": torch.full((3,), float(i)), "meta": {"id": i, "name": f"s{i}"},
                "pair": (i, i * 0.5)}


class FailsAt(Labelled):
    """dataset[bad] raises a KeyError."""

    def __init__(self, n, bad):
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i):
        if i == self.bad:
            raise KeyError(f"no image for {i}")
        return super().__getitem__(i)


class Ragged(Labelled):
    """Sample `odd` has a feature of another shape: the batch holding it does not collate."""

    def __init__(self, n, odd):
        super().__init__(n)
        self.odd = odd

    def __getitem__(self, i):
        import torch
        return {"x": torch.zeros(3 if i == self.odd else 2), "label": i % 10}


class KillsLoaderAt(Labelled):
    """The loader that loads sample `at` is SIGKILLed there, once (a marker file records it)."""

    def __init__(self, n, at, marker, delay=0.0):
        super().__init__(n, delay)
        self.at, self.marker = at, marker

    def __getitem__(self, i):
        if i == self.at and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i)
