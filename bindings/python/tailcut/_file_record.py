"""A whole-file record (format="file") as the pool's loaders hand it to a
transform: its bytes, with the file's path and index in works. A bytes
subclass, so a transform written for bytes keeps working unchanged."""


class FileRecord(bytes):
    """bytes of one work file, with .path (prefix applied, as WorkItem.path
    gives it) and .index (the file's position in the queue's works): a label
    in a folder name, an id in a file name."""

    def __new__(cls, data, path, index):
        record = super().__new__(cls, data)
        record.path, record.index = path, index
        return record

    def __reduce__(self):
        return FileRecord, (bytes(self), self.path, self.index)

    def __repr__(self):
        return f"FileRecord(path={self.path!r}, index={self.index}, {len(self)} bytes)"
