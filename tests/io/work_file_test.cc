// OpenWorkFile: every check made before a work file is read, in one place
// (the Reader and the pooled loaders' slice_records both use it).
#include "tailcut/work_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "engine/queue_test_util.h"

namespace tailcut {
namespace {

using test::TempDir;

FileIdentity IdentityOfPath(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(stat(path.c_str(), &st), 0);
  return IdentityOf(st);
}

std::string Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  return path;
}

TEST(WorkFileTest, TheQueuesFileOpensBlockingAndCloseOnExec) {
  TempDir dir;
  std::string path = Write(dir.path() + "/a", "hello\n");
  const FileIdentity then = IdentityOfPath(path);
  WorkFile f = OpenWorkFile(path, &then);
  ASSERT_GE(f.fd, 0) << f.error;
  EXPECT_TRUE(f.error.empty());
  EXPECT_EQ(fcntl(f.fd, F_GETFL) & O_NONBLOCK, 0);
  EXPECT_NE(fcntl(f.fd, F_GETFD) & FD_CLOEXEC, 0);
  EXPECT_EQ(f.st.st_size, 6);
  close(f.fd);
  // Bytes appended and a new mtime are no change of identity.
  Write(path, "hello\nmore\n");
  f = OpenWorkFile(path, &then);
  ASSERT_GE(f.fd, 0) << f.error;
  close(f.fd);
}

TEST(WorkFileTest, AFifoInTheFilesPlaceIsRefusedWithoutBlocking) {
  TempDir dir;
  std::string path = dir.path() + "/a";
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  WorkFile f = OpenWorkFile(path, nullptr);  // no writer: a blocking open would never return
  EXPECT_EQ(f.fd, -1);
  EXPECT_EQ(f.kind, ErrorKind::kInvalidArgument);
  EXPECT_EQ(f.error, "file '" + path +
                         "' changed since the queue was created: it is no longer a regular file; "
                         "recreate the queue or restore the file");
}

TEST(WorkFileTest, AnotherFileRenamedOverItIsAConfigMismatchNamingTheChange) {
  TempDir dir;
  std::string path = Write(dir.path() + "/a", "hello\n");
  const FileIdentity then = IdentityOfPath(path);
  std::string other = Write(dir.path() + "/b", "hello\n");
  ASSERT_EQ(rename(other.c_str(), path.c_str()), 0);
  WorkFile f = OpenWorkFile(path, &then);
  EXPECT_EQ(f.fd, -1);
  EXPECT_EQ(f.kind, ErrorKind::kConfigMismatch);
  EXPECT_EQ(f.error.rfind("file '" + path + "' changed since the queue was created: inode ", 0), 0u)
      << f.error;
  EXPECT_NE(f.error.find("; recreate the queue or restore the file"), std::string::npos);
  EXPECT_TRUE(OpenWorkFile(path, nullptr).fd >= 0) << "without an identity only the kind counts";
}

TEST(WorkFileTest, ATruncatedFileIsAnIoErrorAndAMissingOneNotFound) {
  TempDir dir;
  std::string path = Write(dir.path() + "/a", "hello\nworld\n");
  const FileIdentity then = IdentityOfPath(path);
  ASSERT_EQ(truncate(path.c_str(), 6), 0);
  WorkFile f = OpenWorkFile(path, &then);
  EXPECT_EQ(f.fd, -1);
  EXPECT_EQ(f.kind, ErrorKind::kIo);
  EXPECT_EQ(f.error, "file '" + path +
                         "' at offset 6: the file is 6 bytes, 12 when the queue was created "
                         "(truncated? restore it or recreate the queue)");
  ASSERT_EQ(unlink(path.c_str()), 0);
  f = OpenWorkFile(path, &then);
  EXPECT_EQ(f.fd, -1);
  EXPECT_EQ(f.kind, ErrorKind::kNotFound);
  EXPECT_EQ(f.open_errno, ENOENT);
  EXPECT_NE(f.error.find("removed after the queue was created?"), std::string::npos) << f.error;
}

}  // namespace
}  // namespace tailcut
