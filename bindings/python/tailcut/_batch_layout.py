"""The layout of a pooled batch in a BatchRing slot (tailcut.pool).

The batch is one array or a tuple/list of arrays (numpy arrays or torch
tensors). The slot's 256-byte user header holds
    magic b"TCB1", u8 version (1), u8 count, 2 bytes padding,
then per array: u8 dtype code (_DTYPES), u8 ndim (<= 4), 2 bytes padding,
u64 offset into the slot data, ndim u64 dims; these end before byte 240.
Array bytes are C-contiguous, each starting at a multiple of 64 in the slot
data. Then the (ticket, begin, end) ranges of the items the batch's records
come from (u64 each; tailcut._pool_state reads them for a checkpoint): in
the header after the array entries where they fit, else in the slot data
after the arrays, at a multiple of 8. The header's last 16 bytes locate
them: magic b"TCRH" (in the header) or b"TCRD" (in the data), u32 count,
u64 offset. A reader checks every field against the bytes that hold it.
"""

import struct

import numpy as np

import tailcut

HEADER_BYTES = 256
_MAGIC = b"TCB1"
_ALIGN = 64
_DTYPES = [np.dtype(t) for t in ("uint8", "int8", "int16", "int32", "int64", "float16",
                                 "float32", "float64", "bool", "uint16", "uint32", "uint64")]
_CODE = {d: i for i, d in enumerate(_DTYPES)}
_IN_HEADER, _IN_DATA = b"TCRH", b"TCRD"  # where the record ranges are
_RANGE_AT = 240  # the header's last 16 bytes: magic, u32 count, u64 offset


def _as_numpy(x):
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x)
    numpy = getattr(x, "numpy", None)  # torch.Tensor, without importing torch here
    if numpy is not None:
        return np.ascontiguousarray(x.detach().cpu().numpy())
    raise TypeError(f"a pooled batch holds numpy arrays or torch tensors, got {type(x).__name__}")


def encode_batch(batch, data, header, ranges=()):
    """Writes `batch` (an array, or a tuple/list of arrays) and the (ticket,
    begin, end) ranges of its records into the writable memoryviews `data`
    and `header` of a slot; returns the bytes used."""
    arrays = [_as_numpy(a) for a in (batch if isinstance(batch, (tuple, list)) else (batch,))]
    meta = bytearray(_MAGIC + struct.pack("<BB2x", 1, len(arrays)))
    offset = 0
    out = np.frombuffer(data, dtype=np.uint8)
    for a in arrays:
        if a.dtype not in _CODE or a.ndim > 4:
            raise TypeError(f"pooled batches hold arrays of dtypes {[str(d) for d in _DTYPES]} "
                            f"and at most 4 dimensions, got {a.dtype} with {a.ndim}")
        offset = -(-offset // _ALIGN) * _ALIGN
        if offset + a.nbytes > len(out):
            raise ValueError(f"a batch of {offset + a.nbytes} bytes does not fit a slot of "
                             f"{len(out)} bytes: pass a larger slot_bytes")
        meta += struct.pack("<BB2xQ", _CODE[a.dtype], a.ndim, offset)
        meta += struct.pack(f"<{a.ndim}Q", *a.shape)
        out[offset:offset + a.nbytes] = a.reshape(-1).view(np.uint8)
        offset += a.nbytes
    if len(meta) > _RANGE_AT:
        raise ValueError(f"a batch of {len(arrays)} arrays does not fit the {HEADER_BYTES}-byte "
                         f"slot header (16 bytes of it locate the record ranges): use fewer "
                         f"arrays")
    header[:len(meta)] = meta
    return _write_ranges(out, offset, header, len(meta), ranges)


def decode_batch(data, header):
    """The arrays of a batch, read-only numpy views over `data` (no copy): one
    array, or a tuple if the batch was a tuple/list."""
    h = bytes(header)
    if h[:4] != _MAGIC:
        raise tailcut.CorruptError(f"pooled batch: bad header magic {h[:4]!r}")
    count = h[5]
    pos, arrays = 8, []
    n = len(data)
    for _ in range(count):
        if pos + 12 > len(h):
            raise tailcut.CorruptError("pooled batch: header too short for its arrays")
        code, ndim, offset = struct.unpack_from("<BB2xQ", h, pos)
        pos += 12
        if code >= len(_DTYPES) or ndim > 4 or pos + 8 * ndim > len(h):
            raise tailcut.CorruptError(f"pooled batch: bad array entry (dtype {code}, ndim {ndim})")
        shape = struct.unpack_from(f"<{ndim}Q", h, pos)
        pos += 8 * ndim
        dtype = _DTYPES[code]
        nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.uint64))
        if offset + nbytes > n:
            raise tailcut.CorruptError(f"pooled batch: array at {offset} of {nbytes} bytes is "
                                       f"beyond the batch's {n} bytes")
        arrays.append(np.frombuffer(data, dtype=dtype, count=nbytes // dtype.itemsize,
                                    offset=offset).reshape(shape))
    return arrays[0] if count == 1 else tuple(arrays)


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
