// tests/fork_child.h: run a test body in a forked child, with a deadline.
//
// InChild forks, runs `body` in the child and _exit()s there (a child never
// returns into GoogleTest, nor runs the parent's destructors at exit). The
// body returns "" when all its checks held, else what failed; a child that
// hangs past the deadline is SIGKILLed and reported as hung, one that
// crashes is reported with its signal.
#ifndef TAILCUT_TESTS_FORK_CHILD_H_
#define TAILCUT_TESTS_FORK_CHILD_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>

namespace tailcut::testing {

inline std::string InChild(const std::function<std::string()>& body, int deadline_seconds = 20) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) return "fork failed";
  if (pid == 0) {
    ::close(fds[0]);
    std::string report;
    try {
      report = body();
    } catch (const std::exception& e) {
      report = std::string("threw: ") + e.what();
    }
    if (!report.empty() && ::write(fds[1], report.data(), report.size()) < 0) report.clear();
    std::fflush(nullptr);
    ::_exit(report.empty() ? 0 : 1);
  }
  ::close(fds[1]);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(deadline_seconds);
  int status = 0;
  std::string hung;
  while (::waitpid(pid, &status, WNOHANG) != pid) {
    if (std::chrono::steady_clock::now() > end) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      hung = "the child hung (killed after " + std::to_string(deadline_seconds) + " s)";
      break;
    }
    ::usleep(5000);
  }
  std::string report;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) report.append(buf, n);
  ::close(fds[0]);
  if (!hung.empty()) return hung + (report.empty() ? "" : ": " + report);
  if (WIFSIGNALED(status)) return "the child died of signal " + std::to_string(WTERMSIG(status));
  if (WEXITSTATUS(status) != 0 && report.empty())
    return "the child exited " + std::to_string(WEXITSTATUS(status));
  return report;
}

}  // namespace tailcut::testing

#endif  // TAILCUT_TESTS_FORK_CHILD_H_
