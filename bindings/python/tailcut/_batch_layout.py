"""The layout of a pooled batch in a BatchRing slot (tailcut.pool).

The batch is one array or a tuple/list of arrays (numpy arrays or torch
tensors), any number of them. The slot's 256-byte user header starts with
    magic b"TCB2", u32 count, u8 where (0: header, 1: data), 3 bytes padding,
    u64 offset and u64 bytes of the array table,
and the array table follows at byte 32 when it fits before byte 240, else it
is in the slot data after the arrays, at a multiple of 8. Per array: u8
dtype code (_DTYPES), u8 ndim (<= 32), 6 bytes padding, u64 offset into the
slot data, ndim u64 dims. Array bytes are C-contiguous, each starting at a
multiple of 64 in the slot data. Then the (ticket, begin, end) ranges of the
items the batch's records come from (u64 each; tailcut._pool_state reads
them for a checkpoint): in the header after the array table where they fit,
else in the slot data after the arrays (and a table there), at a multiple of
8. The header's last 16 bytes locate them: magic b"TCRH" (in the header) or
b"TCRD" (in the data), u32 count, u64 offset. A reader checks every field
against the bytes that hold it.
"""

import struct

import numpy as np

import tailcut
from tailcut import _core

HEADER_BYTES = 256
_MAGIC = b"TCB2"
_TOP = struct.Struct("<4sIB3xQQ")  # magic, count, where, table offset, table bytes
_TABLE_AT = 32  # in the header, when the table fits there
_ENTRY = struct.Struct("<BB6xQ")  # dtype code, ndim, offset; then ndim u64 dims
_MAX_NDIM = 32  # numpy's
_ALIGN = 64
_DTYPES = [np.dtype(t) for t in ("uint8", "int8", "int16", "int32", "int64", "float16",
                                 "float32", "float64", "bool", "uint16", "uint32", "uint64",
                                 "complex64", "complex128")]
_CODE = {d: i for i, d in enumerate(_DTYPES)}
_IN_HEADER, _IN_DATA = b"TCRH", b"TCRD"  # where the record ranges are
_RANGE_AT = 240  # the header's last 16 bytes: magic, u32 count, u64 offset


def _as_numpy(x, i):
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x)
    numpy = getattr(x, "numpy", None)  # torch.Tensor, without importing torch here
    if numpy is not None:
        try:
            return np.ascontiguousarray(x.detach().cpu().numpy())
        except TypeError as e:  # a dtype numpy has not (torch.bfloat16, ...)
            raise TypeError(f"array {i} of a pooled batch is a tensor of dtype {x.dtype}, which "
                            f"numpy has not ({e}); convert it in collate_fn or transform (a "
                            f"map-style dataset's samples carry any dtype)") from None
    raise TypeError(f"a pooled batch holds numpy arrays or torch tensors; array {i} is a "
                    f"{type(x).__name__}")


def encode_batch(batch, data, header, ranges=()):
    """Writes `batch` (an array, or a tuple/list of arrays) and the (ticket,
    begin, end) ranges of its records into the writable memoryviews `data`
    and `header` of a slot; returns the bytes used. A batch with what(i)
    (a map-style batch's leaves) has array i named so in errors."""
    arrays = [_as_numpy(a, i)
              for i, a in enumerate(batch if isinstance(batch, (tuple, list)) else (batch,))]
    table = bytearray()
    offset = 0
    out = np.frombuffer(data, dtype=np.uint8)
    for i, a in enumerate(arrays):
        if a.dtype not in _CODE or a.ndim > _MAX_NDIM:
            raise TypeError(f"array {i} of a pooled batch has dtype {a.dtype} and {a.ndim} "
                            f"dimensions; a batch holds arrays of dtypes "
                            f"{[str(d) for d in _DTYPES]} and at most {_MAX_NDIM} dimensions")
        offset = -(-offset // _ALIGN) * _ALIGN
        if offset + a.nbytes > len(out):
            what = batch.what(i) if hasattr(batch, "what") else f"array {i} of {len(arrays)}"
            raise ValueError(f"a batch of {offset + a.nbytes} bytes or more does not fit a slot "
                             f"of {len(out)} bytes at {what} (dtype {a.dtype}, shape "
                             f"{a.shape}): pass a larger slot_bytes")
        table += _ENTRY.pack(_CODE[a.dtype], a.ndim, offset)
        table += struct.pack(f"<{a.ndim}Q", *a.shape)
        out[offset:offset + a.nbytes] = a.reshape(-1).view(np.uint8)
        offset += a.nbytes
    if _TABLE_AT + len(table) <= _RANGE_AT:
        where, at, header_used = 0, _TABLE_AT, _TABLE_AT + len(table)
        header[at:header_used] = table
    else:  # spills into the data, after the arrays
        where, at, header_used = 1, -(-offset // 8) * 8, _TABLE_AT
        if at + len(table) > len(out):
            raise ValueError(f"a batch of {at + len(table)} bytes (with the table of its "
                             f"{len(arrays)} arrays) does not fit a slot of {len(out)} bytes: "
                             f"pass a larger slot_bytes")
        out[at:at + len(table)] = np.frombuffer(bytes(table), dtype=np.uint8)
        offset = at + len(table)
    header[:_TOP.size] = _TOP.pack(_MAGIC, len(arrays), where, at, len(table))
    return _write_ranges(out, offset, header, header_used, ranges)


# The arrays of a batch, read-only numpy views over `data` (no copy): one
# array, or a tuple if the batch was a tuple/list. Read in C++ (every field
# checked against the bytes that hold it: tailcut/batch_layout.h), as it is
# on a rank's path for every batch.
decode_batch = _core._decode_batch


def _write_ranges(out, offset, header, meta_bytes, ranges):
    """Writes `ranges` into the header after its `meta_bytes` when they fit
    there, else into the slot data `out` (a uint8 array) at the next
    multiple of 8 after `offset`; and where they are into the header's last
    16 bytes. Returns the data bytes used."""
    table = np.asarray(ranges, dtype="<u8").reshape(-1, 3)
    at = -(-meta_bytes // 8) * 8
    if at + table.nbytes <= _RANGE_AT:
        header[at:at + table.nbytes] = table.tobytes()
        header[_RANGE_AT:_RANGE_AT + 16] = _IN_HEADER + struct.pack("<IQ", len(table), at)
        return offset
    at = -(-offset // 8) * 8
    if at + table.nbytes > len(out):
        raise ValueError(f"a batch of {at + table.nbytes} bytes (with the ranges of the "
                         f"{len(table)} items its records come from) does not fit a slot of "
                         f"{len(out)} bytes: pass a larger slot_bytes")
    out[at:at + table.nbytes] = table.reshape(-1).view(np.uint8)
    header[_RANGE_AT:_RANGE_AT + 16] = _IN_DATA + struct.pack("<IQ", len(table), at)
    return at + table.nbytes


def batch_ranges(data, header):
    """The (ticket, begin, end) ranges a published batch holds, as a list of
    tuples; checked against the header's or the batch's size (CorruptError)."""
    magic, count, at = struct.unpack_from("<4sIQ", bytes(header[_RANGE_AT:_RANGE_AT + 16]))
    where = {_IN_HEADER: header, _IN_DATA: data}.get(magic)
    if where is None:
        raise tailcut.CorruptError(f"pooled batch: no record ranges (magic {magic!r}); was it "
                                   f"published by a loader of another tailcut version?")
    limit = _RANGE_AT if where is header else len(data)
    if at % 8 or at + 24 * count > limit:
        raise tailcut.CorruptError(f"pooled batch: {count} record ranges at {at} are beyond "
                                   f"the {limit} bytes that may hold them")
    table = np.frombuffer(where, dtype="<u8", count=3 * count, offset=at).reshape(-1, 3)
    return [tuple(int(v) for v in row) for row in table]


def ranges_mark(data, header):
    """What it takes to know a batch's ranges once its slot is reused: a copy
    of the header, read by marked_ranges only when it is needed, or the
    ranges themselves when they lie in the data."""
    header = bytes(header)
    if header[_RANGE_AT:_RANGE_AT + 4] == _IN_HEADER:
        return header
    return batch_ranges(data, header)


def marked_ranges(mark):
    """The ranges a ranges_mark stands for."""
    return batch_ranges(b"", mark) if isinstance(mark, bytes) else mark
