// tests/fuzz/fuzz_attach.h: what the attach fuzzers share. Each keeps the
// bytes of a healthy segment as a template; an input patches it, the patched
// image is written to a shared-memory object under the name being fuzzed,
// every step (inspect, attach, use) runs on it, and the object is unlinked.
// A step may fail with tailcut::Error (a clean refusal); anything else that
// escapes, and any crash, is a finding.
#ifndef TAILCUT_TESTS_FUZZ_FUZZ_ATTACH_H_
#define TAILCUT_TESTS_FUZZ_FUZZ_ATTACH_H_

#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tailcut/error.h"

namespace tailcut::fuzz {

// The whole shm object at `path` (a template segment); aborts if it cannot
// be read, since every input would then test nothing.
inline std::string ReadImage(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) std::abort();
  const off_t size = ::lseek(fd, 0, SEEK_END);
  std::string image(static_cast<size_t>(size), '\0');
  if (size < 0 || ::pread(fd, image.data(), image.size(), 0) != size) std::abort();
  ::close(fd);
  return image;
}

// The image an input stands for: the template patched by records of
// [u32 offset][u8 length][length bytes] (offsets wrap, so fuzzing gets past
// the magic number), or, for an input starting with 0xFF, the rest raw.
inline std::string PatchedImage(const std::string& tmpl, const uint8_t* data, size_t size) {
  if (size > 0 && data[0] == 0xFF)
    return std::string(reinterpret_cast<const char*>(data + 1), size - 1);
  std::string image = tmpl;
  size_t pos = 0;
  while (pos + 5 <= size) {
    uint32_t offset;
    std::memcpy(&offset, data + pos, 4);
    size_t len = data[pos + 4];
    pos += 5;
    len = std::min(len, size - pos);
    offset %= static_cast<uint32_t>(image.size());
    len = std::min(len, image.size() - offset);
    std::memcpy(image.data() + offset, data + pos, len);
    pos += len;
  }
  return image;
}

// Writes `image` to the shm object at `path`, runs each step in turn (a
// tailcut::Error ends that step, not the rest), then unlinks the object.
template <typename... Steps>
void AttachImage(const std::string& path, const std::string& image, Steps&&... steps) {
  const int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || ::write(fd, image.data(), image.size()) != static_cast<ssize_t>(image.size()))
    std::abort();
  ::close(fd);
  auto run = [](auto& step) {
    try {
      step();
    } catch (const tailcut::Error&) {
    }
  };
  (run(steps), ...);
  ::unlink(path.c_str());
}

}  // namespace tailcut::fuzz

#endif  // TAILCUT_TESTS_FUZZ_FUZZ_ATTACH_H_
