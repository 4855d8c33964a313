// Which process a handle (WorkQueue, Reader, BatchRing) belongs to.
//
// A handle holds process-local state next to shared state: threads (the
// life-mutex holder, pread workers), an io_uring, a client slot registered
// under the opener's life mutex. fork() copies the handle's memory into the
// child but none of the threads, and the client slot stays the parent's. A
// child that used the copy would act as the parent (ack the parent's items,
// free its slot); one that destroyed it would join threads that do not exist.
// So every handle records the process's fork generation when it is opened,
// and every call compares it with the current one:
//
//  * The generation is a process-wide counter that a pthread_atfork child
//    handler bumps. Reading it is one relaxed load: no system call on the hot
//    path (getpid() is one).
//  * Relaxed is enough: the handler runs in the child's only thread before
//    fork() returns there, and threads the child starts later see the new
//    value through pthread_create's happens-before.
//  * Only fork() through libc runs the handlers (os.fork and multiprocessing
//    do); a raw clone(2) or vfork(2) child is not detected.
#ifndef TAILCUT_ENGINE_PROCESS_OWNER_H_
#define TAILCUT_ENGINE_PROCESS_OWNER_H_

#include <atomic>
#include <cstdint>
#include <string>

namespace tailcut::detail {

// Bumped in every forked child (pthread_atfork); see above.
extern std::atomic<uint64_t> g_fork_generation;

class ProcessOwner {
 public:
  // The calling process, now.
  ProcessOwner() noexcept;

  // True in a child forked (at any depth) after the handle was opened.
  bool forked() const noexcept {
    // relaxed: see the file comment; pairs with nothing.
    return g_fork_generation.load(std::memory_order_relaxed) != generation_;
  }
  int pid() const noexcept { return pid_; }
  // "queue 'q' was opened by process 41; this is process 42 (a forked child
  // must open its own WorkQueue)" for what = "queue 'q'", kind = "WorkQueue":
  // the message of every control-path call made from a forked child, as the
  // Python bindings word it.
  std::string ForkedMessage(const std::string& what, const char* kind) const;
  // Throws tailcut::Error (kInvalidArgument) with ForkedMessage when forked().
  // For control-path calls.
  void CheckNotForked(const std::string& what, const char* kind) const;

 private:
  uint64_t generation_;
  int pid_;
};

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_PROCESS_OWNER_H_
