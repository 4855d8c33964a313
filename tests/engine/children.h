// tests/engine/children.h: forked children that report through anonymous
// shared memory, which the parent can still read after a child was
// SIGKILLed, and a gate that starts many children at one instant.
//
// Every wait has a deadline; a child still running then is SIGKILLed and
// reported as hung. The destructor kills and reaps whatever is left, so a
// failed ASSERT never leaks processes. Children must never return into
// GoogleTest: Spawn runs the body and _exit()s with its result (a forked child
// must not destroy the parent's WorkQueue objects, see work_queue.h).
#ifndef TAILCUT_TESTS_ENGINE_CHILDREN_H_
#define TAILCUT_TESTS_ENGINE_CHILDREN_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "tailcut/error.h"
#include "tailcut/work_queue.h"
#include "tests/engine/test_basics.h"

namespace tailcut::test {

// What children write into the shared log.
enum class Rec : uint32_t {
  kTaken = 1,      // Take returned kOk
  kIntent = 2,     // about to call Ack (written before the call)
  kAcked = 3,      // Ack returned kOk
  kStale = 4,      // Ack returned kStale
  kGaveBack = 5,   // GiveBack returned kOk
  kProgress = 6,   // about to call Progress ([begin, end): the item's start to the offset)
  kSaveBegin = 7,  // about to call SaveState
  kSaveEnd = 8,    // SaveState returned (ticket = its checkpoint slot)
};

// For kIntent/kAcked records of RunWorker, [begin, end) is the byte range the
// process consumed (less than the item when a tail was split off), and
// `flags` is 1 for a piece split off another process's item.
struct Record {
  Rec kind;
  uint32_t flags;
  uint64_t epoch;
  uint64_t index;
  uint64_t ticket;
  uint64_t begin;
  uint64_t end;
  // Stamped by ChildContext::Log from one counter shared by all children: the
  // order of records across processes (Log is called after what it reports
  // returned, or before what it announces is called).
  uint64_t seq = 0;
};

namespace detail {

// One child's part of the shared region. Plain atomics in MAP_SHARED memory:
// lock-free 32/64-bit atomics are address-free, so they work across fork.
struct alignas(64) ChildSlot {
  std::atomic<uint64_t> count;     // records published (release)
  std::atomic<uint32_t> overflow;  // more records than room
  std::atomic<uint32_t> error_len;
  std::atomic<uint64_t> values[16];  // child -> parent
  std::atomic<uint32_t> flags[8];    // parent -> child
  char error[4096];
};

}  // namespace detail

// A MAP_SHARED anonymous region: written by children, read by the parent,
// even after the writer was SIGKILLed.
class SharedRegion {
 public:
  explicit SharedRegion(size_t bytes) : size_(bytes) {
    ptr_ = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (ptr_ == MAP_FAILED) throw std::runtime_error(ErrnoText("mmap"));
  }
  ~SharedRegion() { ::munmap(ptr_, size_); }
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  void* data() const { return ptr_; }
  size_t size() const { return size_; }

 private:
  void* ptr_;
  size_t size_;
};

// A byte string handed from a child to the parent (e.g. a SaveState()).
class SharedBlob {
 public:
  explicit SharedBlob(size_t capacity) : region_(capacity + 64), capacity_(capacity) {}
  // In a child. False if it does not fit.
  bool Put(std::string_view s) {
    if (s.size() > capacity_) return false;
    std::memcpy(static_cast<char*>(region_.data()) + 64, s.data(), s.size());
    len()->store(s.size() + 1, std::memory_order_release);  // 0 means "nothing yet"
    return true;
  }
  std::optional<std::string> Get() const {
    const uint64_t n = len()->load(std::memory_order_acquire);
    if (n == 0) return std::nullopt;
    return std::string(static_cast<const char*>(region_.data()) + 64, n - 1);
  }

 private:
  std::atomic<uint64_t>* len() const { return static_cast<std::atomic<uint64_t>*>(region_.data()); }
  SharedRegion region_;
  size_t capacity_;
};

// How a child ended.
struct ChildResult {
  pid_t pid = -1;
  bool exited = false;
  int exit_code = -1;
  bool signaled = false;
  int signal = 0;
  bool hung = false;  // still running at the deadline; we SIGKILLed it
  std::string error;  // what the child reported, if anything

  bool Ok() const { return exited && exit_code == 0 && !hung; }
  bool Killed() const { return signaled && signal == SIGKILL && !hung; }
  std::string Describe() const {
    std::ostringstream out;
    out << "pid " << pid << ": ";
    if (hung) {
      out << "HUNG (killed at the deadline)";
    } else if (exited) {
      out << "exit " << exit_code;
    } else if (signaled) {
      out << "signal " << signal << " (" << ::strsignal(signal) << ")";
    } else {
      out << "not reaped";
    }
    if (!error.empty()) out << "; reported: " << error;
    return out.str();
  }
};

class Children;

// Given to a child's body: its index and its way to report.
class ChildContext {
 public:
  size_t index() const { return index_; }

  // Publishes one record; async-signal-safe, survives a later SIGKILL.
  void Log(const Record& r) noexcept {
    const uint64_t n = slot_->count.load(std::memory_order_relaxed);
    if (n >= capacity_) {
      slot_->overflow.store(1, std::memory_order_relaxed);
      return;
    }
    records_[n] = r;
    records_[n].seq = seq_->fetch_add(1, std::memory_order_seq_cst) + 1;
    slot_->count.store(n + 1, std::memory_order_release);  // pairs with Records()' acquire
  }
  void Log(Rec kind, const WorkItem& it) noexcept {
    Log(Record{kind, 0, it.epoch, it.index, it.ticket, it.begin, it.end});
  }

  void SetValue(int k, uint64_t v) noexcept {
    slot_->values[k].store(v, std::memory_order_release);
  }

  // Waits until the parent sets flag k; false at the timeout.
  bool WaitFlag(int k, milliseconds timeout) const {
    const auto deadline = Clock::now() + timeout;
    while (slot_->flags[k].load(std::memory_order_acquire) == 0) {
      if (Clock::now() >= deadline) return false;
      ::usleep(200);
    }
    return true;
  }
  bool Flag(int k) const { return slot_->flags[k].load(std::memory_order_acquire) != 0; }

  // Records why the child failed; returns an exit code to return from the body.
  int Fail(const std::string& why) noexcept {
    const uint32_t have = slot_->error_len.load(std::memory_order_relaxed);
    if (have == 0) {  // keep the first error: it is the cause
      const size_t n = std::min(why.size(), sizeof(slot_->error) - 1);
      std::memcpy(slot_->error, why.data(), n);
      slot_->error[n] = '\0';
      slot_->error_len.store(static_cast<uint32_t>(n + 1), std::memory_order_release);
    }
    return 1;
  }

 private:
  friend class Children;
  ChildContext(size_t index, detail::ChildSlot* slot, Record* records, size_t capacity,
               std::atomic<uint64_t>* seq)
      : index_(index), slot_(slot), records_(records), capacity_(capacity), seq_(seq) {}
  size_t index_;
  detail::ChildSlot* slot_;
  Record* records_;
  size_t capacity_;
  std::atomic<uint64_t>* seq_;
};

// Forked children with a shared report area. Not thread-safe; use from the
// test's main thread.
class Children {
 public:
  Children(size_t max_children, size_t records_per_child)
      : max_(max_children),
        capacity_(records_per_child),
        region_(max_children * (sizeof(detail::ChildSlot) + records_per_child * sizeof(Record)) +
                4096 + 64) {}

  ~Children() {
    for (size_t i = 0; i < pids_.size(); ++i) {
      if (!results_[i]) {
        ::kill(pids_[i], SIGKILL);
        int st;
        while (::waitpid(pids_[i], &st, 0) < 0 && errno == EINTR) {
        }
      }
    }
  }
  Children(const Children&) = delete;
  Children& operator=(const Children&) = delete;

  // Forks a child that runs body and _exit()s with its return value (an
  // escaping exception is reported and exits 3). Returns the child's index.
  size_t Spawn(std::function<int(ChildContext&)> body) {
    const size_t i = pids_.size();
    if (i >= max_) throw std::logic_error("Children: more children than room");
    ChildContext ctx(i, slot(i), records(i), capacity_, seq());
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error(ErrnoText("fork"));
    if (pid == 0) {
      // A child must not outlive a test binary that crashed or was killed.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(97);
      int code = 3;
      try {
        code = body(ctx);
      } catch (const tailcut::Error& e) {
        ctx.Fail("uncaught " + ErrorText(e));
      } catch (const std::exception& e) {
        ctx.Fail(std::string("uncaught exception: ") + e.what());
      } catch (...) {
        ctx.Fail("uncaught non-std exception");
      }
      ::_exit(code);
    }
    pids_.push_back(pid);
    results_.emplace_back();
    return i;
  }

  size_t size() const { return pids_.size(); }
  pid_t pid(size_t i) const { return pids_[i]; }
  bool Reaped(size_t i) const { return results_[i].has_value(); }

  // Reaps child i if it ended; true if it has.
  bool Poll(size_t i) {
    if (results_[i]) return true;
    int st = 0;
    const pid_t r = ::waitpid(pids_[i], &st, WNOHANG);
    if (r == pids_[i]) {
      results_[i] = MakeResult(i, st, false);
      return true;
    }
    return false;
  }

  // Waits for child i until the deadline; SIGKILLs and reports it as hung if
  // it is still running then.
  ChildResult Wait(size_t i, Clock::time_point deadline) {
    useconds_t nap = 50;
    while (!Poll(i)) {
      if (Clock::now() >= deadline) {
        ::kill(pids_[i], SIGKILL);
        int st = 0;
        while (::waitpid(pids_[i], &st, 0) < 0 && errno == EINTR) {
        }
        results_[i] = MakeResult(i, st, true);
        break;
      }
      ::usleep(nap);
      nap = std::min<useconds_t>(nap * 2, 2000);
    }
    return *results_[i];
  }
  ChildResult Wait(size_t i, milliseconds timeout) { return Wait(i, Clock::now() + timeout); }

  // Waits for every child with one common deadline.
  std::vector<ChildResult> WaitAll(milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    std::vector<ChildResult> out;
    for (size_t i = 0; i < pids_.size(); ++i) out.push_back(Wait(i, deadline));
    return out;
  }

  // Waits until child i is stopped (SIGSTOP); false at the timeout or if it
  // ended instead.
  bool WaitStopped(size_t i, milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      if (results_[i]) return false;
      int st = 0;
      const pid_t r = ::waitpid(pids_[i], &st, WNOHANG | WUNTRACED);
      if (r == pids_[i]) {
        if (WIFSTOPPED(st)) return true;
        results_[i] = MakeResult(i, st, false);
        return false;
      }
      if (Clock::now() >= deadline) return false;
      ::usleep(200);
    }
  }

  void Kill(size_t i, int sig) {
    if (!results_[i]) ::kill(pids_[i], sig);
  }

  std::vector<Record> Records(size_t i) const {
    const uint64_t n =
        std::min<uint64_t>(slot(i)->count.load(std::memory_order_acquire), capacity_);
    return std::vector<Record>(records(i), records(i) + n);
  }
  bool Overflowed(size_t i) const { return slot(i)->overflow.load() != 0; }
  uint64_t Value(size_t i, int k) const {
    return slot(i)->values[k].load(std::memory_order_acquire);
  }
  // Waits until value k of child i is nonzero, or the child ended, or the
  // timeout; returns the value (0 if none).
  uint64_t WaitValue(size_t i, int k, milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      if (const uint64_t v = Value(i, k); v != 0) return v;
      if (Poll(i) || Clock::now() >= deadline) return Value(i, k);
      ::usleep(100);
    }
  }
  void SetFlag(size_t i, int k) { slot(i)->flags[k].store(1, std::memory_order_release); }
  std::string Error(size_t i) const {
    if (slot(i)->error_len.load(std::memory_order_acquire) == 0) return "";
    return std::string(slot(i)->error);
  }

 private:
  ChildResult MakeResult(size_t i, int st, bool hung) const {
    ChildResult r;
    r.pid = pids_[i];
    r.hung = hung;
    if (WIFEXITED(st)) {
      r.exited = true;
      r.exit_code = WEXITSTATUS(st);
    } else if (WIFSIGNALED(st)) {
      r.signaled = true;
      r.signal = WTERMSIG(st);
    }
    r.error = Error(i);
    return r;
  }
  // Rounded up so that every slot keeps ChildSlot's 64-byte alignment.
  size_t SlotStride() const {
    size_t bytes = sizeof(detail::ChildSlot) + capacity_ * sizeof(Record);
    return (bytes + alignof(detail::ChildSlot) - 1) / alignof(detail::ChildSlot) *
           alignof(detail::ChildSlot);
  }
  // The record counter, in the last 64 bytes (past every slot).
  std::atomic<uint64_t>* seq() const {
    return reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(region_.data()) +
                                                    region_.size() - 64);
  }
  detail::ChildSlot* slot(size_t i) const {
    return reinterpret_cast<detail::ChildSlot*>(static_cast<char*>(region_.data()) +
                                                i * SlotStride());
  }
  Record* records(size_t i) const {
    return reinterpret_cast<Record*>(reinterpret_cast<char*>(slot(i)) + sizeof(detail::ChildSlot));
  }

  size_t max_;
  size_t capacity_;
  SharedRegion region_;
  std::vector<pid_t> pids_;
  std::vector<std::optional<ChildResult>> results_;
};

// Releases many children at the same instant: each child calls Wait() (which
// blocks on a pipe); the parent calls Open(), closing the write end. Every
// child spawned while the gate exists must call Wait() (or CloseInChild()),
// or the gate never opens for the others.
class StartGate {
 public:
  StartGate() {
    if (::pipe2(fds_, O_CLOEXEC) != 0) throw std::runtime_error(ErrnoText("pipe2"));
  }
  ~StartGate() {
    if (fds_[0] >= 0) ::close(fds_[0]);
    if (fds_[1] >= 0) ::close(fds_[1]);
  }
  StartGate(const StartGate&) = delete;
  StartGate& operator=(const StartGate&) = delete;

  // In a child: blocks until the parent opens the gate; false on timeout.
  bool Wait(milliseconds timeout) {
    CloseInChild();
    const auto deadline = Clock::now() + timeout;
    char c;
    for (;;) {
      // Non-blocking read polled with a short nap keeps the timeout simple.
      const ssize_t r = ::read(fds_[0], &c, 1);
      if (r == 0) return true;  // every write end closed: open
      if (r < 0 && errno != EAGAIN && errno != EINTR) return false;
      if (Clock::now() >= deadline) return false;
      ::usleep(50);
    }
  }
  void CloseInChild() {
    if (fds_[1] >= 0) {
      ::close(fds_[1]);
      fds_[1] = -1;
    }
    const int fl = ::fcntl(fds_[0], F_GETFL);
    ::fcntl(fds_[0], F_SETFL, fl | O_NONBLOCK);
  }
  // In the parent.
  void Open() {
    if (fds_[1] >= 0) {
      ::close(fds_[1]);
      fds_[1] = -1;
    }
  }

 private:
  int fds_[2] = {-1, -1};
};

}  // namespace tailcut::test

#endif  // TAILCUT_TESTS_ENGINE_CHILDREN_H_
