// RunDeviceReads: a batch of reads through an IoBackend (see
// io/record_device_reads.h).
#include "io/record_device_reads.h"

#include <cerrno>

namespace tailcut::detail {

bool RunDeviceReads(IoBackend& backend, uint32_t queue_depth, std::vector<DeviceFile>* files,
                    std::vector<DeviceRead>* reads,
                    const std::function<void(size_t)>& refuse_direct, DeviceReadFailure* failure) {
  std::vector<DeviceRead>& all = *reads;
  size_t next = 0;  // the next read never started
  uint32_t in_flight = 0;
  bool failed = false;
  auto start = [&](size_t i) {
    DeviceRead& r = all[i];
    const DeviceFile& f = (*files)[r.file];
    ReadRequest request;
    request.fd = f.fd;
    request.buf = reinterpret_cast<std::byte*>(r.buf + r.done);
    request.len = r.len - r.done;
    request.offset = r.offset + r.done;
    request.tag = i;
    request.direct = f.direct;
    backend.Prepare(request);
    ++in_flight;
  };
  auto fail = [&](size_t i, uint64_t offset, int error) {
    if (failed) return;  // the first failure is the one reported
    failed = true;
    failure->read = i;
    failure->offset = offset;
    failure->error = error;
  };
  std::vector<ReadResult> results(queue_depth);
  for (;;) {
    while (!failed && in_flight < queue_depth && next < all.size()) start(next++);
    if (in_flight == 0) break;
    int got = backend.Reap(results.data(), static_cast<int>(results.size()), /*wait=*/true);
    if (got < 0) {
      // Neither submitted nor reaped: what is in flight cannot be waited for.
      fail(0, 0, -got);
      failure->backend_failed = true;
      return false;
    }
    for (int k = 0; k < got; ++k) {
      const size_t i = static_cast<size_t>(results[k].tag);
      DeviceRead& r = all[i];
      DeviceFile& f = (*files)[r.file];
      const int res = results[k].res;
      --in_flight;
      if (failed) continue;  // draining: no more reads
      const uint64_t at = r.offset + r.done;
      if (res == -EAGAIN || res == -EINTR) {
        if (++r.retries <= kDeviceReadMaxRetries) {
          start(i);
        } else {
          fail(i, at, -res);
        }
        continue;
      }
      if (res == -EINVAL && f.direct) {
        // The filesystem took O_DIRECT at open but refuses the read: its file
        // is read buffered from here on (reads already started keep their
        // direct fd, which the caller keeps open until the end).
        refuse_direct(r.file);
        if (!f.direct) {
          start(i);
          continue;
        }
      }
      if (res < 0) {
        fail(i, at, -res);
        continue;
      }
      r.done += static_cast<uint32_t>(res);
      if (r.done >= r.need) continue;  // complete
      // res == 0: the file ends before `need`. A short O_DIRECT read that
      // ends off a block boundary stops at the end of the file too.
      if (res == 0 || (f.direct && r.done % f.align != 0)) {
        fail(i, r.offset + r.done, 0);
        continue;
      }
      start(i);  // a short read: the rest
    }
  }
  return !failed;
}

}  // namespace tailcut::detail
