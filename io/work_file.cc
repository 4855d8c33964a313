// OpenWorkFile: every check made before a work file is read (see work_file.h).
#include "tailcut/work_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace tailcut {

namespace {

// Closes the fd and says why; allocation failure leaves the text empty (the
// kind still says what), since the function must not throw.
__attribute__((format(printf, 3, 4))) void Refuse(WorkFile* f, ErrorKind kind, const char* format,
                                                  ...) noexcept {
  if (f->fd >= 0) ::close(f->fd);
  f->fd = -1;
  f->kind = kind;
  char text[1024];
  va_list args;
  va_start(args, format);
  vsnprintf(text, sizeof text, format, args);
  va_end(args);
  try {
    f->error.assign(text);
  } catch (...) {
  }
}

std::string Shown(const std::string& path) noexcept {
  try {
    return Printable(path);
  } catch (...) {
    return std::string();
  }
}

}  // namespace

WorkFile OpenWorkFile(const std::string& path, const FileIdentity* expected,
                      int extra_flags) noexcept {
  WorkFile f;
  const std::string shown = Shown(path);
  const char* name = shown.c_str();
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | extra_flags);
  if (f.fd < 0) {
    const int err = errno;
    f.open_errno = err;
    // The queue checked every file when it was created: say what changed since.
    Refuse(&f, ErrorKindOfErrno(err), "file '%s': cannot open: %s%s", name, strerror(err),
           err == ENOENT   ? " (removed after the queue was created? restore it or recreate "
                             "the queue)"
           : err == EACCES ? " (made unreadable after the queue was created? fix its "
                             "permissions)"
                           : "");
    return f;
  }
  if (::fstat(f.fd, &f.st) != 0) {
    const int err = errno;
    Refuse(&f, ErrorKindOfErrno(err), "file '%s': cannot stat: %s", name, strerror(err));
    return f;
  }
  if (!S_ISREG(f.st.st_mode)) {  // e.g. a FIFO renamed over it
    Refuse(&f, ErrorKind::kInvalidArgument,
           "file '%s' changed since the queue was created: it is no longer a regular file; "
           "recreate the queue or restore the file",
           name);
    return f;
  }
  if (expected != nullptr) {
    const uint64_t size = static_cast<uint64_t>(f.st.st_size);
    if (size < expected->size) {  // changed under the queue, like a short read
      Refuse(&f, ErrorKind::kIo,
             "file '%s' at offset %" PRIu64 ": the file is %" PRIu64 " bytes, %" PRIu64
             " when the queue was created (truncated? restore it or recreate the queue)",
             name, size, size, expected->size);
      return f;
    }
    // The very file the queue was made of, not another put in its place.
    const FileIdentity now = IdentityOf(f.st);
    if (now.inode != expected->inode || now.device != expected->device) {
      std::string change;
      try {
        change = DescribeFileChange(*expected, now);
      } catch (...) {
      }
      Refuse(&f, ErrorKind::kConfigMismatch,
             "file '%s' changed since the queue was created: %s; recreate the queue or restore "
             "the file",
             name, change.c_str());
      return f;
    }
  }
  // Reads may block from here on (io_uring would answer -EAGAIN rather than
  // wait on a non-blocking file).
  ::fcntl(f.fd, F_SETFL, ::fcntl(f.fd, F_GETFL) & ~O_NONBLOCK);
  return f;
}

}  // namespace tailcut
