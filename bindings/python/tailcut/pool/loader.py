"""tailcut.pool.loader: the loader side of a pool, for loaders run by hand.

PooledLoader starts and stops its loaders itself (tailcut.pool). This module
is for what runs beside it (docs/pooled.md):
  run_loader(ds, ring_name, ...)   the loop of one loader process (another
                                   launcher, a separate service)
  start_loaders(...)               forks loader processes, as PooledLoader does
  main(argv)                       python3 -m tailcut.pool
  pool_spec_path, read_pool_spec   the pool's description local rank 0 writes
  item_records, default_collate    a loader's records of a slice, and its batch
  encode_batch, decode_batch,      the batch layout in a ring slot
  HEADER_BYTES                     ("Batch layout in a slot"; the dtype codes
                                   are tailcut._batch_layout._DTYPES)
"""

from tailcut._batch_layout import HEADER_BYTES, decode_batch, encode_batch
from tailcut.pool._cli import main
from tailcut.pool._description import pool_spec_path, read_pool_spec
from tailcut.pool._loader import run_loader, start_loaders
from tailcut.pool._recipe import default_collate, item_records

__all__ = ["run_loader", "start_loaders", "main", "pool_spec_path", "read_pool_spec",
           "item_records", "default_collate", "encode_batch", "decode_batch", "HEADER_BYTES"]
