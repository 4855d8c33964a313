// tests/engine/temp_dir.h: a private temporary directory that writes work
// files (sparse: the engine only looks at their sizes).
#ifndef TAILCUT_TESTS_ENGINE_TEMP_DIR_H_
#define TAILCUT_TESTS_ENGINE_TEMP_DIR_H_

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "tests/engine/test_basics.h"

namespace tailcut::test {

// A private temporary directory, removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl =
        std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/tailcut_test.XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) throw std::runtime_error(ErrnoText("mkdtemp"));
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

  // Creates (or resizes) a sparse file of `size` bytes; returns its path. The
  // engine only looks at sizes, so sparse files stand in for real data.
  std::string File(const std::string& name, uint64_t size) const {
    const std::string p = path_ + "/" + name;
    const int fd = ::open(p.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error(ErrnoText("open") + " " + p);
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
      ::close(fd);
      throw std::runtime_error(ErrnoText("ftruncate") + " " + p);
    }
    ::close(fd);
    return p;
  }

  // `count` files named <stem>0, <stem>1, ... with the given sizes (cycled).
  std::vector<std::string> Files(const std::string& stem, size_t count,
                                 const std::vector<uint64_t>& sizes) const {
    std::vector<std::string> out;
    for (size_t i = 0; i < count; ++i)
      out.push_back(File(stem + std::to_string(i), sizes[i % sizes.size()]));
    return out;
  }

 private:
  std::string path_;
};

}  // namespace tailcut::test

#endif  // TAILCUT_TESTS_ENGINE_TEMP_DIR_H_
