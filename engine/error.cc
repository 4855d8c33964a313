#include "tailcut/error.h"

#include <cerrno>
#include <cstdio>

namespace tailcut {

const char* ErrorKindName(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      return "invalid argument";
    case ErrorKind::kNotFound:
      return "not found";
    case ErrorKind::kPermission:
      return "permission";
    case ErrorKind::kNoSpace:
      return "no space";
    case ErrorKind::kConfigMismatch:
      return "config mismatch";
    case ErrorKind::kCorrupt:
      return "corrupt";
    case ErrorKind::kTimeout:
      return "timeout";
    case ErrorKind::kIo:
      return "io";
  }
  return "unknown";
}

ErrorKind ErrorKindOfErrno(int err) noexcept {
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return ErrorKind::kNotFound;
    case EACCES:
    case EPERM:
    case EROFS:
      return ErrorKind::kPermission;
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
      return ErrorKind::kNoSpace;
    case ELOOP:
    case ENAMETOOLONG:
    case EINVAL:
      return ErrorKind::kInvalidArgument;
    default:
      return ErrorKind::kIo;
  }
}

std::string Printable(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  auto escape = [&](unsigned char c) {
    char buf[5];
    std::snprintf(buf, sizeof buf, "\\x%02x", c);
    out.append(buf, 4);
  };
  for (size_t i = 0; i < bytes.size();) {
    auto c = static_cast<unsigned char>(bytes[i]);
    if (c < 0x20 || c == 0x7f) {
      escape(c);
      ++i;
      continue;
    }
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    // A UTF-8 sequence: lead byte, then 1-3 continuation bytes; overlong
    // forms and surrogates are not UTF-8 either.
    size_t n = c >= 0xc2 && c <= 0xdf   ? 2
               : c >= 0xe0 && c <= 0xef ? 3
               : c >= 0xf0 && c <= 0xf4 ? 4
                                        : 0;
    bool ok = n != 0 && i + n <= bytes.size();
    for (size_t k = 1; ok && k < n; ++k)
      ok = (static_cast<unsigned char>(bytes[i + k]) & 0xc0) == 0x80;
    if (ok && n >= 3) {
      auto c1 = static_cast<unsigned char>(bytes[i + 1]);
      ok = !(c == 0xe0 && c1 < 0xa0) && !(c == 0xed && c1 >= 0xa0) && !(c == 0xf0 && c1 < 0x90) &&
           !(c == 0xf4 && c1 >= 0x90);
    }
    if (!ok) {
      escape(c);
      ++i;
      continue;
    }
    out.append(bytes.substr(i, n));
    i += n;
  }
  return out;
}

}  // namespace tailcut
