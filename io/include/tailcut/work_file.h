// tailcut/work_file.h: opening a work file with the checks every reader of
// one makes (the Reader's backends, the pooled loaders' slice_records).
//
// A queue records each work file's identity when it is created
// (WorkQueue::files()). What is found at the path later may be something
// else: a FIFO put in its place (open(2) would block forever), a directory,
// another file renamed over it, the file truncated. Reading any of them
// silently gives a different data set, or hangs; OpenWorkFile refuses them
// with an error that names the file, what changed and the fix.
//
// Contract
//  * Thread- and process-safe; noexcept: errors come back in the WorkFile.
//  * Ownership: on success the caller owns WorkFile::fd and closes it.
//  * The file's mtime may move (a file restored in place after an error is
//    read again, bytes appended are not read: see docs/reliability.md).
#ifndef TAILCUT_WORK_FILE_H_
#define TAILCUT_WORK_FILE_H_

#include <sys/stat.h>

#include <string>

#include "tailcut/error.h"
#include "tailcut/export.h"
#include "tailcut/work_queue.h"

namespace tailcut {

struct WorkFile {
  int fd = -1;          // >= 0: open for reading, O_CLOEXEC, blocking
  struct ::stat st {};  // fstat of fd
  int open_errno = 0;   // fd < 0 because open(2) failed with this errno (else 0)
  ErrorKind kind = ErrorKind::kIo;
  // fd < 0: e.g. "file '/d/a.bin' changed since the queue was created: inode
  // 12 -> 34; recreate the queue or restore the file".
  std::string error;
};

// Opens `path` read-only with O_CLOEXEC | O_NONBLOCK | extra_flags (e.g.
// O_DIRECT); O_NONBLOCK, so that a FIFO in the file's place does not block,
// is cleared once the checks pass. Checks that it is a regular file
// (kInvalidArgument) and, with `expected` (the queue's identity of the file),
// that it has at least expected->size bytes (kIo: truncated) and the same
// inode and device (kConfigMismatch: another file put in its place). A
// failed open(2) is the kind of its errno (kNotFound, kPermission, ...).
TAILCUT_EXPORT WorkFile OpenWorkFile(const std::string& path, const FileIdentity* expected,
                                     int extra_flags = 0) noexcept;

}  // namespace tailcut

#endif  // TAILCUT_WORK_FILE_H_
