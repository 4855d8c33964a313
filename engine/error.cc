#include "tailcut/error.h"

namespace tailcut {

const char* ErrorKindName(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return "invalid argument";
    case ErrorKind::kNotFound: return "not found";
    case ErrorKind::kPermission: return "permission";
    case ErrorKind::kNoSpace: return "no space";
    case ErrorKind::kConfigMismatch: return "config mismatch";
    case ErrorKind::kCorrupt: return "corrupt";
    case ErrorKind::kTimeout: return "timeout";
    case ErrorKind::kIo: return "io";
  }
  return "unknown";
}

}  // namespace tailcut
