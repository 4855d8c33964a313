// tailcut/error.h: the control-path error type.
//
// Control-path calls (create, attach, open, restore) throw tailcut::Error. Its
// message names the thing (queue, segment path, file, offset, field) and says
// what to do. Hot-path calls (take, ack, next record) never throw; they return
// status codes.
#ifndef TAILCUT_ERROR_H_
#define TAILCUT_ERROR_H_

#include <stdexcept>
#include <string>
#include <string_view>

#include "tailcut/export.h"

namespace tailcut {

enum class ErrorKind {
  kInvalidArgument,  // a bad option or name
  kNotFound,         // a work file or queue does not exist
  kPermission,       // a file or segment we may not use (owner, mode, EACCES)
  kNoSpace,          // /dev/shm or memory is full
  kConfigMismatch,   // an existing queue was made with another configuration
  kCorrupt,          // a segment, checkpoint or record that fails validation
  kTimeout,          // a bounded wait ran out (e.g. creator never published READY)
  kIo,               // a read or system call failed
};

class TAILCUT_EXPORT Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

// A short lowercase name of the kind, e.g. "config mismatch".
TAILCUT_EXPORT const char* ErrorKindName(ErrorKind kind) noexcept;

// The kind of a failed system call's errno, the one mapping every control
// path uses: ENOENT, ENOTDIR -> kNotFound; EACCES, EPERM, EROFS ->
// kPermission; ENOSPC, EDQUOT, ENOMEM -> kNoSpace; ELOOP, ENAMETOOLONG,
// EINVAL -> kInvalidArgument (the path or value given is unusable); else kIo.
TAILCUT_EXPORT ErrorKind ErrorKindOfErrno(int err) noexcept;

// `bytes` fit for a message: valid UTF-8 is kept, control characters, DEL
// and bytes that are not UTF-8 become \xNN, so that a name or path with a NUL
// or in another encoding neither cuts a message short nor makes it
// undecodable (Python decodes messages as UTF-8).
TAILCUT_EXPORT std::string Printable(std::string_view bytes);

}  // namespace tailcut

#endif  // TAILCUT_ERROR_H_
