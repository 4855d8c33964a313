// io/record_device_reads.h: a batch of reads run through an IoBackend
// (io_uring or pread threads) to completion, for ReadRecords' kUring and
// kPread paths (io/record_read.cc).
//
// The batch is known whole before the first read starts (a batch of a global
// shuffle: its records sorted by file and offset, neighbours coalesced), so
// every read is prepared at once and the backend keeps up to queue_depth of
// them in flight: a cold disk serves them in parallel instead of one page
// fault at a time. Results are handled as the Reader handles its chunks
// (io/reader_reads.cc): a short read is continued from where it stopped,
// -EAGAIN/-EINTR are retried, -EINVAL on an O_DIRECT read switches its file
// to buffered reads, anything else fails the batch.
//
// Contract: the caller owns every buffer and fd and keeps them alive until
// RunDeviceReads returns, also when it fails (it returns only once no read is
// in flight, except after a backend error: see the return value).
#ifndef TAILCUT_IO_RECORD_DEVICE_READS_H_
#define TAILCUT_IO_RECORD_DEVICE_READS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "io/io_backend.h"

namespace tailcut::detail {

// One file of the batch as it is open now.
struct DeviceFile {
  int fd = -1;
  bool direct = false;  // fd was opened O_DIRECT
  uint64_t align = 1;   // direct: the offset, length and buffer alignment
};

// One read: bytes [offset, offset + len) of file `file` into buf. `need`
// bytes must arrive; need < len only for an O_DIRECT read rounded up past
// the end of the file (the read stops at the end, on no block boundary).
struct DeviceRead {
  size_t file = 0;
  char* buf = nullptr;
  uint64_t offset = 0;  // aligned_offset when its file is direct
  uint32_t len = 0;
  uint32_t need = 0;
  uint32_t done = 0;     // bytes arrived so far
  uint32_t retries = 0;  // -EAGAIN/-EINTR so far
};

// Why a batch failed: read `read` at file offset `offset` got `error`
// (positive errno), or the file ended there (error 0).
struct DeviceReadFailure {
  size_t read = 0;
  uint64_t offset = 0;
  int error = 0;
  // Reads may still be in flight (the backend itself failed): their buffers
  // must be leaked and the backend dropped without waiting.
  bool backend_failed = false;
};

constexpr uint32_t kDeviceReadMaxRetries = 1000;  // -EAGAIN/-EINTR per read, as the Reader

// Runs `reads` through `backend`, at most queue_depth in flight. When an
// O_DIRECT read fails with EINVAL, calls refuse_direct(file), which must
// reopen the file buffered and update files[file] (direct = false), then
// reads it buffered from there on. Returns true when every read got its
// `need` bytes; false and *failure for the first read that failed, once
// nothing is in flight (unless failure->backend_failed).
bool RunDeviceReads(IoBackend& backend, uint32_t queue_depth, std::vector<DeviceFile>* files,
                    std::vector<DeviceRead>* reads,
                    const std::function<void(size_t)>& refuse_direct, DeviceReadFailure* failure);

}  // namespace tailcut::detail

#endif  // TAILCUT_IO_RECORD_DEVICE_READS_H_
