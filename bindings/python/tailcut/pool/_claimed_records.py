"""The records of one work item as a loader hands them on: a batch's worth
at a time, each claimed first (WorkItem.claim), so that a loader with
nothing left to take splits off what this one has not claimed yet.

Without claims, an item was one loader's from its first record to its
last: a job of one file (one item per file) ran on one loader however many
the pool had, and at each epoch's end the other loaders sat idle while the
last items were read one batch after another. With them, the unclaimed rest
of the slowest item goes to idle loaders, at most a batch of it at a time
left with its owner."""

from tailcut.pool._recipe import item_records

# File bytes read at a time: a window over the item, not the whole item (an
# item may be a whole file), as slice_records reads at least this much anyway.
READ_BYTES = 1 << 20


class ClaimedRecords:
    """Hands out the records of `item` (a WorkItem this process took) that
    are still this loader's: take(n) claims and returns at most n of them.
    An index work's records are its sample indices. Not thread-safe: one
    loader's loop."""

    def __init__(self, item, fmt, index_work):
        self.item, self.fmt, self.index_work = item, fmt, index_work
        # Where this loader's part ends: lowered by each claim that finds the
        # tail split off.
        self.end = item.end
        # The offset the next record starts at (at first: at or after it).
        self.position = item.begin
        # Records read but not yet handed out: records[at:], ends[i] the
        # offset just past records[i]; the next read starts at read_to.
        self.records, self.ends, self.at = [], [], 0
        self.read_to = item.begin

    def take(self, n):
        """(records, end): at most n records, claimed, and the offset just past
        the last; ([], position) once none of the item is left to this loader.
        StaleItemError: the item went to another loader (this one was stopped
        past its stop_timeout)."""
        if self.index_work:
            return self._take_positions(n)
        if self.at == len(self.records) and not self._read():
            return [], self.position
        upto = min(len(self.records), self.at + n)
        last_end = self.ends[upto - 1]
        end = self.item.claim(last_end)
        self.end = min(self.end, end)
        if end < last_end:
            # Another loader split the tail off inside what this take wanted: this
            # loader's records are those that start before `end`, which only the
            # parser can tell of the item's first record (its start may lie past
            # the item's begin): read them again, to `end`.
            records, ends = (self._read_range(self.position, end) if end > self.position
                             else ([], []))
            self.records, self.ends, self.at, self.read_to = [], [], 0, end
            if records:
                self.position = ends[-1]
            return records, self.position
        records = self.records[self.at:upto]
        self.at, self.position = upto, last_end
        return records, last_end

    def _take_positions(self, n):
        up_to = min(self.position + n, self.end)
        if up_to > self.position:
            self.end = min(self.end, self.item.claim(up_to))
        stop = min(up_to, self.end)
        if stop <= self.position:
            return [], self.position
        records = self.item.indices(self.position, stop)
        self.position = stop
        return records, stop

    def _read(self):
        """Reads the next window of the item's records; False once the part
        left to this loader is read."""
        while self.read_to < self.end:
            stop = min(self.end, self.read_to + READ_BYTES)
            self.records, self.ends = self._read_range(self.read_to, stop)
            self.at = 0
            # The next record starts where the last one ends, at or past stop; no
            # record in the window (one longer than it): go on from stop.
            self.read_to = max(stop, self.ends[-1]) if self.ends else stop
            if self.records:
                return True
        return False

    def _read_range(self, begin, end):
        return item_records(self.item.path, begin, end, self.fmt, with_ends=True, item=self.item)
