// A redis-server of the test's own: 127.0.0.1, a free port, a temp dir,
// appendonly yes + appendfsync always. Killed (SIGKILL) in the destructor, and
// by the kernel if the test process dies first (PR_SET_PDEATHSIG).
#ifndef TAILCUT_TESTS_GLOBAL_REDIS_SERVER_H_
#define TAILCUT_TESTS_GLOBAL_REDIS_SERVER_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace tailcut::testing {

inline std::string FindRedisServer() {
  for (const char* dir : {"/usr/bin", "/usr/local/bin", "/usr/sbin"}) {
    std::string path = std::string(dir) + "/redis-server";
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

// A port nobody listens on now (bind to port 0, read it, close).
inline int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t size = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &size);
  close(fd);
  return ntohs(addr.sin_port);
}

inline bool PortAnswers(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// In a test: skips it, saying why, where redis-server is not installed.
#define SKIP_WITHOUT_REDIS()                         \
  if (::tailcut::testing::FindRedisServer().empty()) \
  GTEST_SKIP() << "redis-server is not installed (apt-get install redis-server)"

class RedisServer {
 public:
  // extra: more redis-server options, e.g. {"--requirepass", "x"}.
  explicit RedisServer(std::vector<std::string> extra = {})
      : binary_(FindRedisServer()), port_(FreePort()), extra_(std::move(extra)) {
    char dir[] = "/tmp/tailcut-redis-XXXXXX";
    dir_ = mkdtemp(dir);
    Start();
  }
  ~RedisServer() {
    Kill();
    std::filesystem::remove_all(dir_);
  }

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_) + "/0"; }

  void Start() {
    pid_t parent = getpid();
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      std::vector<std::string> args = {binary_,
                                       "--bind",
                                       "127.0.0.1",
                                       "--port",
                                       std::to_string(port_),
                                       "--dir",
                                       dir_,
                                       "--save",
                                       "",
                                       "--appendonly",
                                       "yes",
                                       "--appendfsync",
                                       "always",
                                       "--daemonize",
                                       "no",
                                       "--logfile",
                                       dir_ + "/redis.log"};
      args.insert(args.end(), extra_.begin(), extra_.end());
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(binary_.c_str(), argv.data());
      _exit(127);
    }
    auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!PortAnswers(port_) && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // SIGKILL, as a crash: what appendfsync always wrote is all that survives.
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  std::string binary_;
  int port_;
  std::vector<std::string> extra_;
  std::string dir_;
  pid_t pid_ = -1;
};

}  // namespace tailcut::testing

#endif  // TAILCUT_TESTS_GLOBAL_REDIS_SERVER_H_
