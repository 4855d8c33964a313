// tests/engine/queue_test_util.h: helpers for tests that run real processes
// against one WorkQueue.
//
//  * TempDir: a private directory with generated (sparse) work files.
//  * UniqueQueueName / QueueGuard: names no other test or run can collide
//    with, and a guard that force-removes the queue at the end of a test.
//  * Children: forked children that report through anonymous shared memory,
//    which the parent can still read after a child was SIGKILLed. Every wait
//    has a deadline; a child still running then is SIGKILLed and reported as
//    hung. The destructor kills and reaps whatever is left, so a failed
//    ASSERT never leaks processes.
//  * CheckItem: the invariants every handed-out WorkItem must satisfy.
//  * RunWorker: the body of a worker child (take, optionally Claim chunks
//    like tailcut's Reader, ack / give back), logging "about to ack" before
//    each Ack and "acked" after it.
//  * ExactlyOnce / Coverage: per-(epoch, item) ack counts, or acked byte
//    ranges that must tile each item when tails may be split.
//
// Children must never return into GoogleTest: Spawn runs the body and
// _exit()s with its result (a forked child must not destroy the parent's
// WorkQueue objects, see work_queue.h).
#ifndef TAILCUT_TESTS_ENGINE_QUEUE_TEST_UTIL_H_
#define TAILCUT_TESTS_ENGINE_QUEUE_TEST_UTIL_H_

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "tailcut/error.h"
#include "tailcut/work_queue.h"

namespace tailcut::test {

using Clock = std::chrono::steady_clock;
using std::chrono::microseconds;
using std::chrono::milliseconds;

// ---------------------------------------------------------------- basics

inline std::string ErrnoText(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

inline bool Contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

inline bool ContainsNoCase(std::string_view haystack, std::string_view needle) {
  std::string h(haystack), n(needle);
  for (char& c : h) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (char& c : n) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return h.find(n) != std::string::npos;
}

inline bool PathExists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

inline double MillisSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Busy-waits about `us` microseconds (sleeping is too coarse for per-item work).
inline void Spin(uint64_t us) {
  const auto end = Clock::now() + microseconds(us);
  while (Clock::now() < end) {
  }
}

// A number from the environment (decimal, 0x hex or 0 octal), else fallback.
inline uint64_t EnvU64(const char* name, uint64_t fallback) {
  const char* s = std::getenv(name);
  return s != nullptr && *s != '\0' ? std::strtoull(s, nullptr, 0) : fallback;
}

// A seed for randomized tests: TAILCUT_TEST_SEED if set, else the clock. Tests
// print it on failure so a run can be repeated.
inline uint64_t TestSeed() {
  return EnvU64("TAILCUT_TEST_SEED",
                static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^
                    (static_cast<uint64_t>(::getpid()) << 32));
}

// ---------------------------------------------------------------- files

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

// ---------------------------------------------------------------- queues

// A name unique to this process and call, e.g. "tctest_1234_7_order".
inline std::string UniqueQueueName(std::string_view tag) {
  static std::atomic<uint64_t> counter{0};
  return "tctest_" + std::to_string(::getpid()) + "_" + std::to_string(counter.fetch_add(1)) + "_" +
         std::string(tag);
}

// Force-removes the queue when the test ends (kNotFound is fine).
class QueueGuard {
 public:
  explicit QueueGuard(std::string name) : name_(std::move(name)) {}
  ~QueueGuard() {
    try {
      RemoveQueue(name_, /*force=*/true);
    } catch (const Error&) {
    }
  }
  QueueGuard(const QueueGuard&) = delete;
  QueueGuard& operator=(const QueueGuard&) = delete;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

// Options every test starts from: quiet notices unless a test captures them.
inline WorkQueueOptions BaseOptions(const std::string& name, std::vector<std::string> works) {
  WorkQueueOptions o;
  o.name = name;
  o.works = std::move(works);
  o.on_notice = [](const std::string&) {};
  return o;
}

// The fixture the engine suites share: a temporary directory for work files
// and fresh queue names that are force-removed when the test ends.
class QueueTest : public ::testing::Test {
 protected:
  std::string NewName(std::string_view tag) {
    std::string n = UniqueQueueName(tag);
    guards_.push_back(std::make_unique<QueueGuard>(n));
    return n;
  }
  TempDir dir_;
  std::vector<std::unique_ptr<QueueGuard>> guards_;
};

inline std::string ErrorText(const tailcut::Error& e) {
  return std::string("tailcut::Error(") + ErrorKindName(e.kind()) + "): " + e.what();
}

// Succeeds if f throws a tailcut::Error of `kind` whose message contains every
// needle; the failure message shows what happened instead.
inline ::testing::AssertionResult FailsWith(const std::function<void()>& f, ErrorKind kind,
                                            const std::vector<std::string>& needles = {}) {
  try {
    f();
  } catch (const tailcut::Error& e) {
    if (e.kind() != kind) {
      return ::testing::AssertionFailure()
             << "threw kind '" << ErrorKindName(e.kind()) << "' instead of '" << ErrorKindName(kind)
             << "': " << e.what();
    }
    for (const std::string& n : needles) {
      if (!Contains(e.what(), n)) {
        return ::testing::AssertionFailure() << "message does not name '" << n << "': " << e.what();
      }
    }
    return ::testing::AssertionSuccess() << e.what();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-tailcut exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw (expected " << ErrorKindName(kind) << ")";
}

inline const char* StatusName(TakeStatus s) { return TakeStatusName(s); }
inline const char* StatusName(AckStatus s) { return AckStatusName(s); }

inline std::string CheckItem(const WorkQueue& q, const WorkItem& it) {
  std::ostringstream out;
  const uint64_t n = q.num_items();
  if (n == 0) return "queue has no items but handed one out";
  if (it.epoch >= q.num_epochs()) {
    out << "epoch " << it.epoch << " >= num_epochs " << q.num_epochs();
  } else if (it.ticket / n != it.epoch) {
    out << "ticket " << it.ticket << " is not in epoch " << it.epoch << " (num_items " << n << ")";
  } else if (it.index >= n) {
    out << "index " << it.index << " >= num_items " << n;
  } else if (q.ItemAt(it.epoch, it.ticket % n) != it.index) {
    out << "ticket " << it.ticket << " maps to item " << q.ItemAt(it.epoch, it.ticket % n)
        << " but the item says index " << it.index;
  } else {
    const WorkQueue::Item& ref = q.items()[it.index];
    if (it.file != ref.file) {
      out << "item " << it.index << " file " << it.file << " != table file " << ref.file;
    } else if (it.file >= q.paths().size() || it.path != q.paths()[it.file]) {
      out << "item " << it.index << " path '" << it.path << "' is not paths()[" << it.file << "]";
    } else if (it.begin < ref.begin || it.begin > it.end || it.end > ref.end) {
      // Any part of the item: a restored item resumes at its progress, a
      // split moves an anchor's end down and a piece covers part of a tail.
      out << "item " << it.index << " range [" << it.begin << "," << it.end
          << ") does not fit table range [" << ref.begin << "," << ref.end << ")";
    }
  }
  return out.str();
}

// Takes and acks until kEnd, with a deadline per Take. Returns the items in
// the order taken. Fails the test on kEmpty (a hang) or a bad item/ack.
inline std::vector<WorkItem> Drain(WorkQueue& q, milliseconds per_take = milliseconds(20000)) {
  std::vector<WorkItem> got;
  for (;;) {
    WorkItem it;
    const TakeStatus st = q.Take(&it, Clock::now() + per_take);
    if (st == TakeStatus::kEnd) break;
    if (st != TakeStatus::kOk) {
      ADD_FAILURE() << "Take returned " << StatusName(st) << " (deadline " << per_take.count()
                    << " ms) in Drain, " << got.size() << " items in";
      break;
    }
    const std::string bad = CheckItem(q, it);
    EXPECT_EQ(bad, "");
    const AckStatus a = q.Ack(it);
    EXPECT_EQ(a, AckStatus::kOk) << "ack of ticket " << it.ticket;
    got.push_back(it);
  }
  return got;
}

// (epoch, index) -> a dense key.
inline uint64_t Key(uint64_t num_items, uint64_t epoch, uint64_t index) {
  return epoch * num_items + index;
}

// Checks per-(epoch,index) counts are all exactly 1; "" when they are.
inline std::string ExactlyOnce(const std::vector<uint32_t>& counts, uint64_t num_items) {
  std::ostringstream out;
  int shown = 0;
  uint64_t missing = 0, dup = 0;
  for (uint64_t k = 0; k < counts.size(); ++k) {
    if (counts[k] == 1) continue;
    (counts[k] == 0 ? missing : dup) += 1;
    if (shown++ < 8) {
      out << " (epoch " << k / num_items << ", item " << k % num_items << ") x" << counts[k] << ";";
    }
  }
  if (missing == 0 && dup == 0) return "";
  return std::to_string(missing) + " missing, " + std::to_string(dup) + " duplicated:" + out.str();
}

// Byte-range accounting, for queues whose items may be split: per (epoch,
// item), the acked ranges must tile the item's [begin, end) exactly once.
class Coverage {
 public:
  Coverage(std::vector<WorkQueue::Item> items, uint64_t num_epochs)
      : items_(std::move(items)), ranges_(items_.size() * num_epochs), uncertain_(ranges_.size()) {}

  uint64_t num_items() const { return items_.size(); }
  // An acked range; false if it lies outside the queue.
  bool Add(uint64_t epoch, uint64_t index, uint64_t begin, uint64_t end) {
    const uint64_t k = Key(items_.size(), epoch, index);
    if (index >= items_.size() || k >= ranges_.size()) return false;
    ranges_[k].emplace_back(begin, end);
    return true;
  }
  // A range whose Ack a killed process may or may not have finished.
  void AddUncertain(uint64_t epoch, uint64_t index, uint64_t begin, uint64_t end) {
    const uint64_t k = Key(items_.size(), epoch, index);
    if (index < items_.size() && k < uncertain_.size()) uncertain_[k].emplace_back(begin, end);
  }

  // "" when every item of every epoch is covered exactly once (an uncertain
  // range may fill a gap it exactly matches), else the first problems.
  std::string Check() const {
    std::ostringstream out;
    int shown = 0;
    for (uint64_t k = 0; k < ranges_.size() && shown < 8; ++k) {
      const WorkQueue::Item& ref = items_[k % items_.size()];
      auto r = ranges_[k];
      std::sort(r.begin(), r.end());
      std::string bad;
      uint64_t pos = ref.begin;
      for (const auto& [b, e] : r) {
        if (b < pos) {
          bad = "bytes [" + std::to_string(b) + ", " + std::to_string(std::min(e, pos)) +
                ") acked twice";
          break;
        }
        if (b > pos) {
          // A gap: only a dead process's unfinished ack may fill it, exactly.
          if (!FillsGap(k, pos, b)) {
            bad = "bytes [" + std::to_string(pos) + ", " + std::to_string(b) + ") never acked";
            break;
          }
        }
        if (e < b) {
          bad = "empty-reversed range";
          break;
        }
        pos = e;
      }
      if (bad.empty() && r.empty() && ref.begin == ref.end && !FillsGap(k, ref.begin, ref.end)) {
        bad = "empty item never acked";
      }
      if (bad.empty() && pos < ref.end && !FillsGap(k, pos, ref.end)) {
        bad = "bytes [" + std::to_string(pos) + ", " + std::to_string(ref.end) + ") never acked";
      }
      if (bad.empty() && pos > ref.end) bad = "acked past the item's end";
      if (!bad.empty()) {
        out << " (epoch " << k / items_.size() << ", item " << k % items_.size() << " ["
            << ref.begin << ", " << ref.end << ")): " << bad << ";";
        ++shown;
      }
    }
    return out.str();
  }

 private:
  bool FillsGap(uint64_t k, uint64_t b, uint64_t e) const {
    // The gap must be the union of uncertain ranges, back to back: e must
    // be reachable from b. Sorted by start, every range that can end at a
    // start comes before it.
    auto u = uncertain_[k];
    std::sort(u.begin(), u.end());
    std::set<uint64_t> reach{b};
    for (const auto& [ub, ue] : u) {
      if (ue <= e && reach.count(ub) != 0) reach.insert(ue);
    }
    return reach.count(e) != 0;
  }
  std::vector<WorkQueue::Item> items_;
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> ranges_;
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> uncertain_;
};

// The item table a configuration gives, from a throwaway queue of the same
// works and slicing (opened and removed here).
inline std::vector<WorkQueue::Item> ItemTable(const std::vector<std::string>& works,
                                              std::optional<uint64_t> num_slices,
                                              const std::string& prefix = "") {
  auto o = BaseOptions(UniqueQueueName("probe"), works);
  o.num_slices = num_slices;
  o.prefix = prefix;
  o.shuffle = false;
  QueueGuard guard(o.name);
  auto q = WorkQueue::Open(o);
  std::vector<WorkQueue::Item> items = q->items();
  q->Close();
  return items;
}

// ---------------------------------------------------------------- children

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

// What a queue restored from a state saved during [save_begin, save_end)
// (record seqs) may take as done, from one process's log of the run the
// state was saved from: its acks that finished before the save began surely,
// and its acks and Progress calls that began before the save ended maybe (a
// Progress offset is where a restored item may resume). An ack a killed process may
// or may not have finished counts as overlapping.
inline void AddAckedBeforeSave(Coverage* cov, const std::vector<Record>& log, bool killed,
                               uint64_t save_begin, uint64_t save_end) {
  std::optional<Record> pending;
  for (const Record& r : log) {
    if (r.kind == Rec::kIntent) pending = r;
    if (r.kind == Rec::kStale) pending.reset();
    if (r.kind == Rec::kProgress && r.seq < save_end)
      cov->AddUncertain(r.epoch, r.index, r.begin, r.end);
    if (r.kind == Rec::kAcked) {
      if (r.seq < save_begin) {
        cov->Add(r.epoch, r.index, r.begin, r.end);
      } else if (pending && pending->seq < save_end) {
        cov->AddUncertain(r.epoch, r.index, r.begin, r.end);
      }
      pending.reset();
    }
  }
  if (pending && pending->seq < save_end && killed) {
    cov->AddUncertain(pending->epoch, pending->index, pending->begin, pending->end);
  }
}

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

// What a worker child does with each item (see RunWorker).
struct WorkerOptions {
  uint32_t batch = 1;    // items held at once (taken, then acked in random order)
  double give_back = 0;  // chance to GiveBack an item instead of acking it
  double progress = 0;   // chance to report Progress before the ack
  // Chance to Commit half of what it consumed before the ack (or give-back),
  // logged as an ack of that half (kIntent, kAcked): the rest comes back
  // from there, to whoever takes the item next.
  double commit = 0;
  uint64_t spin_us = 0;           // busy work per item
  uint64_t sleep_us = 0;          // sleep per item
  uint64_t stop_after = ~0ull;    // return after this many acks, without reaching the end
  bool allow_stale = false;       // kStale acks are logged, not failures
  uint64_t die_after_takes = 0;   // SIGKILL itself right after this many takes (0: never)
  uint64_t stop_after_takes = 0;  // SIGSTOP itself right after this many takes (0: never)
  // Read like tailcut's Reader: Claim each chunk of this many bytes before
  // "reading" it (spinning chunk_spin_us), stop at the end Claim reports (a
  // tail split off by another process). 0: no Claim, the item is never split.
  uint64_t claim_chunk = 0;
  uint64_t chunk_spin_us = 0;
  milliseconds take_timeout{20000};  // a Take that waits this long is a hang
  uint64_t rng_seed = 1;
};

// Child values RunWorker sets.
enum WorkerValue : int { kValueNumItems = 15, kValueTakeEnd = 14 };

// The body of a worker child: takes until kEnd (or stop_after acks), logging
// kTaken, kIntent (before Ack), kAcked / kStale (after) and kGaveBack. Returns
// the exit code for the child.
inline int RunWorker(WorkQueue& q, ChildContext& c, const WorkerOptions& w) {
  std::mt19937_64 rng(w.rng_seed * 0x9E3779B97F4A7C15ull + c.index());
  std::uniform_real_distribution<double> coin(0, 1);
  c.SetValue(kValueNumItems, q.num_items());
  std::vector<WorkItem> batch;
  batch.reserve(w.batch);
  uint64_t acked = 0, taken = 0;
  for (;;) {
    batch.clear();
    TakeStatus last = TakeStatus::kOk;
    while (batch.size() < w.batch) {
      WorkItem it;
      last = batch.empty() ? q.Take(&it, Clock::now() + w.take_timeout) : q.TryTake(&it);
      if (last != TakeStatus::kOk) break;
      if (std::string bad = CheckItem(q, it); !bad.empty()) return c.Fail("bad item: " + bad);
      c.Log(Rec::kTaken, it);
      batch.push_back(it);
      ++taken;
      if (taken == w.die_after_takes) ::raise(SIGKILL);
      if (taken == w.stop_after_takes) ::raise(SIGSTOP);
    }
    if (batch.empty()) {
      if (last == TakeStatus::kEnd) {
        c.SetValue(kValueTakeEnd, 1);
        return 0;
      }
      return c.Fail(std::string("Take returned ") + StatusName(last) + " (deadline " +
                    std::to_string(w.take_timeout.count()) +
                    " ms): the queue neither handed out an item nor ended");
    }
    std::shuffle(batch.begin(), batch.end(), rng);
    for (const WorkItem& it : batch) {
      if (w.sleep_us > 0) ::usleep(static_cast<useconds_t>(w.sleep_us));
      if (w.spin_us > 0) Spin(w.spin_us);
      // The bytes this process consumed: all of the item, or with Claim up
      // to where another process split the tail off.
      uint64_t covered_end = it.end;
      if (w.claim_chunk > 0) {
        uint64_t pos = it.begin, end = it.end;
        while (pos < end) {
          const uint64_t up_to = std::min(pos + w.claim_chunk, it.end);
          const AckStatus cs = q.Claim(it, up_to, &end);
          if (cs == AckStatus::kStale && w.allow_stale) break;
          if (cs != AckStatus::kOk) return c.Fail(std::string("Claim returned ") + StatusName(cs));
          if (end > it.end || end < pos) {
            return c.Fail("Claim moved the end of ticket " + std::to_string(it.ticket) + " to " +
                          std::to_string(end) + ", outside [" + std::to_string(pos) + ", " +
                          std::to_string(it.end) + "]");
          }
          if (pos >= end) break;
          pos = std::min(up_to, end);
          if (w.chunk_spin_us > 0) Spin(w.chunk_spin_us);
        }
        covered_end = pos;
      }
      uint64_t from = it.begin;
      if (w.commit > 0 && coin(rng) < w.commit && covered_end > it.begin) {
        Record handed{Rec::kIntent,
                      it.piece ? 1u : 0u,
                      it.epoch,
                      it.index,
                      it.ticket,
                      it.begin,
                      it.begin + (covered_end - it.begin) / 2};
        c.Log(handed);
        const AckStatus cs = q.Commit(it, handed.end);
        if (cs == AckStatus::kStale && w.allow_stale) {
          c.Log(Rec::kStale, it);
          continue;
        }
        if (cs != AckStatus::kOk) return c.Fail(std::string("Commit returned ") + StatusName(cs));
        handed.kind = Rec::kAcked;
        c.Log(handed);
        from = handed.end;
      }
      const Record consumed{Rec::kIntent, it.piece ? 1u : 0u, it.epoch, it.index, it.ticket,
                            from,         covered_end};
      if (w.progress > 0 && coin(rng) < w.progress) {
        // Half of what this process consumed, as a reader reports it.
        const uint64_t offset = it.begin + (covered_end - it.begin) / 2;
        c.Log(Record{Rec::kProgress, 0, it.epoch, it.index, it.ticket, it.begin, offset});
        const AckStatus p = q.Progress(it, offset, 1);
        if (p != AckStatus::kOk && !(p == AckStatus::kStale && w.allow_stale)) {
          return c.Fail(std::string("Progress returned ") + StatusName(p));
        }
      }
      if (w.give_back > 0 && coin(rng) < w.give_back) {
        const AckStatus g = q.GiveBack(it);
        if (g == AckStatus::kOk) {
          c.Log(Rec::kGaveBack, it);
          continue;
        }
        if (!(g == AckStatus::kStale && w.allow_stale)) {
          return c.Fail(std::string("GiveBack returned ") + StatusName(g));
        }
        c.Log(Rec::kStale, it);
        continue;
      }
      c.Log(consumed);
      const AckStatus a = q.Ack(it);
      if (a == AckStatus::kOk) {
        Record done = consumed;
        done.kind = Rec::kAcked;
        c.Log(done);
        ++acked;
      } else if (a == AckStatus::kStale && w.allow_stale) {
        c.Log(Rec::kStale, it);
      } else {
        return c.Fail("Ack of ticket " + std::to_string(it.ticket) + " returned " + StatusName(a));
      }
    }
    if (acked >= w.stop_after) return 0;
  }
}

// Adds child i's kAcked records to counts (indexed by Key()).
inline void CountAcks(const Children& kids, size_t i, uint64_t num_items,
                      std::vector<uint32_t>* counts) {
  for (const Record& r : kids.Records(i)) {
    if (r.kind != Rec::kAcked) continue;
    const uint64_t k = Key(num_items, r.epoch, r.index);
    if (k < counts->size()) (*counts)[k]++;
  }
}

inline uint64_t CountKind(const Children& kids, size_t i, Rec kind) {
  uint64_t n = 0;
  for (const Record& r : kids.Records(i)) n += r.kind == kind;
  return n;
}

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

// Removes segments this test binary left in /dev/shm (a test that failed
// half-way, a child killed before its guard ran).
class LeftoverSegmentCleaner : public ::testing::Environment {
 public:
  void TearDown() override {
    const std::string mark = ".tctest_" + std::to_string(::getpid()) + "_";
    DIR* d = ::opendir("/dev/shm");
    if (d == nullptr) return;
    std::vector<std::string> found;
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n.rfind("tailcut.", 0) == 0 && Contains(n, mark)) found.push_back(n);
    }
    ::closedir(d);
    for (const std::string& n : found) ::unlink(("/dev/shm/" + n).c_str());
  }
};

inline ::testing::Environment* const kLeftoverSegmentCleaner =
    ::testing::AddGlobalTestEnvironment(new LeftoverSegmentCleaner);

}  // namespace tailcut::test

#endif  // TAILCUT_TESTS_ENGINE_QUEUE_TEST_UTIL_H_
