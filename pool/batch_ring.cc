// BatchRing: joining and leaving a ring segment, waiting and waking, and the
// public hot path over RingCore.
#include "tailcut/batch_ring.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <thread>

#include "engine/clock.h"
#include "engine/config.h"
#include "engine/futex.h"
#include "engine/process_owner.h"
#include "engine/robust_mutex.h"
#include "io/buffer_arena.h"
#include "io/cuda_host.h"
#include "pool/ring_core.h"
#include "pool/ring_segment.h"

namespace tailcut {

using detail::RingCore;

static_assert(BatchRing::kUserHeaderBytes == detail::kUserHeaderBytes);
static_assert(BatchRing::kAllEpochs == detail::kAllEpochs);

namespace {

constexpr auto kCheckEvery = std::chrono::milliseconds(10);  // dead-client checks while waiting
constexpr int kSpins = 16;  // tries before sleeping: a batch often comes within microseconds

uint64_t Fingerprint(uint64_t slot_bytes, uint32_t num_slots, uint32_t max_clients) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t v : {uint64_t{detail::kRingLayoutVersion}, slot_bytes, uint64_t{num_slots},
                     uint64_t{max_clients}, uint64_t{detail::kUserHeaderBytes}}) {
    h ^= v;
    h *= 0x100000001b3ull;
  }
  return h;
}

void FutexWait(detail::SharedAtomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns) {
  detail::FutexWait(*word, expected, static_cast<uint64_t>(timeout_ns));
}

// Wakes up to `count` sleepers on `seq`, if any sleep.
void Wake(detail::SharedAtomic<uint32_t>& seq, detail::SharedAtomic<uint32_t>& waiters,
          int count) noexcept {
  // The fence orders the caller's ring change before the load of waiters;
  // it pairs with the fence in Wait between raising waiters and looking at
  // the ring again (Dekker): either the sleeper sees the change or we see it.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // seq_cst, after the fence: pairs with Wait's seq_cst increment of waiters and its fence.
  if (waiters.load(std::memory_order_seq_cst) == 0) return;
  // seq_cst: pairs with Wait's load of seq: FUTEX_WAIT fails if it read the old value.
  seq.fetch_add(1, std::memory_order_seq_cst);
  detail::FutexWake(seq, count);
}

RingStatus FromCore(RingCore::Result r) {
  switch (r) {
    case RingCore::Result::kOk:
      return RingStatus::kOk;
    case RingCore::Result::kEmpty:
      return RingStatus::kTimeout;
    case RingCore::Result::kStale:
      return RingStatus::kStale;
    case RingCore::Result::kCorrupt:
      return RingStatus::kCorrupt;
  }
  return RingStatus::kCorrupt;
}

bool Ended(uint64_t ended_plus1, uint64_t through_epoch) {
  if (through_epoch == BatchRing::kAllEpochs) return ended_plus1 == detail::kAllEpochs;
  return ended_plus1 >= through_epoch + 1;
}

Error Corrupt(const detail::RingSegment& s, const std::string& what) {
  return Error(ErrorKind::kCorrupt, "batch ring '" + s.name() + "': " + s.path() +
                                        " is not a valid tailcut batch ring: " + what +
                                        ". Remove it (RemoveBatchRing) and start again");
}

// The geometry of a mapped segment whose creator published READY, after
// checking magic, version, size, counts and mutexes; throws kCorrupt.
detail::RingGeometry CheckSegment(const detail::RingSegment& seg) {
  const detail::RingHeader& h = *reinterpret_cast<const detail::RingHeader*>(seg.base());
  // acquire: pairs with the creator's release store of magic (Open); callers loaded state first.
  if (h.magic.load(std::memory_order_acquire) != detail::kRingMagic)
    throw Corrupt(seg, "bad magic number");
  if (h.layout_version != detail::kRingLayoutVersion)
    throw Corrupt(seg, "layout version " + std::to_string(h.layout_version) +
                           ", this tailcut reads " + std::to_string(detail::kRingLayoutVersion));
  if (h.total_size != seg.size())
    throw Corrupt(seg, "header says " + std::to_string(h.total_size) + " bytes, object has " +
                           std::to_string(seg.size()));
  detail::RingGeometry g = detail::ComputeRingGeometry(h.slot_bytes, h.num_slots, h.max_clients);
  if (g.total == 0) throw Corrupt(seg, "slot or client counts out of range");
  if (g.total != seg.size() || g.ring_cells != h.ring_cells)
    throw Corrupt(seg, "its counts need " + std::to_string(g.total) + " bytes, object has " +
                           std::to_string(seg.size()));
  if (h.fingerprint != Fingerprint(h.slot_bytes, h.num_slots, h.max_clients))
    throw Corrupt(seg, "configuration fingerprint does not match its fields");
  if (!detail::IsRobustMutex(&h.admin_mutex)) throw Corrupt(seg, "its admin lock is damaged");
  RingCore core(seg.base(), g);
  for (uint64_t c = 0; c < g.max_clients; ++c)
    if (!detail::IsRobustMutex(&core.client(c).life))
      throw Corrupt(seg, "the lock of client slot " + std::to_string(c) + " is damaged");
  std::string problem = core.Validate();
  if (!problem.empty()) throw Corrupt(seg, problem);
  return g;
}

// Recovers client `c` whose life mutex this thread just got with
// EOWNERDEAD (R6), then frees the client slot.
void RecoverOne(RingCore& core, uint64_t c) noexcept {
  detail::RingClient& rc = core.client(c);
  uint64_t reclaimed = 0, redelivered = 0;
  core.RecoverClient(c, &reclaimed, &redelivered);
  detail::RingCounters& k = core.counters();
  // relaxed: statistics only.
  k.reclaimed.fetch_add(reclaimed, std::memory_order_relaxed);
  k.redelivered.fetch_add(redelivered, std::memory_order_relaxed);
  pthread_mutex_consistent(&rc.life);
  // release: pairs with the acquire loads of state in RecoverDead, Register, Leave and StatsOf:
  // whoever sees the client FREE sees its slots recovered. left_ns: statistics only.
  rc.state.store(detail::kRingClientFree, std::memory_order_release);
  rc.left_ns.store(detail::MonotonicNs(), std::memory_order_relaxed);
  pthread_mutex_unlock(&rc.life);
  Wake(k.free_seq, k.free_waiters, INT_MAX);
  Wake(k.ready_seq, k.ready_waiters, INT_MAX);
}

int RecoverDead(RingCore& core, uint64_t self) noexcept {
  int recovered = 0;
  for (uint64_t c = 0; c < core.geometry().max_clients; ++c) {
    if (c == self) continue;
    detail::RingClient& rc = core.client(c);
    // acquire: pairs with the release stores of state in Register, Leave and RecoverOne; a filter
    // only, the trylock decides.
    if (rc.state.load(std::memory_order_acquire) != detail::kRingClientActive) continue;
    int r = detail::TryLockRobust(&rc.life);
    if (r == EOWNERDEAD) {
      RecoverOne(core, c);
      ++recovered;
    } else if (r == 0) {
      pthread_mutex_unlock(&rc.life);  // joining or leaving right now
    }
  }
  return recovered;
}

BatchRingStats StatsOf(RingCore& core, const detail::RingSegment& seg, uint64_t self) {
  BatchRingStats s;
  s.now_ns = detail::MonotonicNs();
  const detail::RingGeometry& g = core.geometry();
  s.name = seg.name();
  s.segment_path = seg.path();
  s.slot_bytes = g.slot_bytes;
  s.num_slots = g.num_slots;
  for (uint64_t i = 0; i < g.num_slots; ++i) {
    // acquire: pairs with the slot-word CASes in RingCore; the states are only counted.
    switch (detail::SlotStateOf(core.slot(i).word.load(std::memory_order_acquire))) {
      case detail::kSlotFree:
        ++s.free;
        break;
      case detail::kSlotFilling:
        ++s.filling;
        break;
      case detail::kSlotReady:
        ++s.ready;
        break;
      default:
        ++s.popped;
        break;
    }
  }
  const detail::RingCounters& k = core.counters();
  // relaxed: statistics only. ended_through's acquire pairs with EndEpoch's CAS; it is only
  // reported.
  s.published = k.published.load(std::memory_order_relaxed);
  s.released = k.released.load(std::memory_order_relaxed);
  s.reclaimed = k.reclaimed.load(std::memory_order_relaxed);
  s.redelivered = k.redelivered.load(std::memory_order_relaxed);
  s.stale_tokens = k.stale_tokens.load(std::memory_order_relaxed);
  s.ended_through = k.ended_through_plus1.load(std::memory_order_acquire);
  s.closed = s.ended_through == detail::kAllEpochs;
  for (uint64_t c = 0; c < g.max_clients; ++c) {
    detail::RingClient& rc = core.client(c);
    // acquire: as in RecoverDead. The fields below are statistics, relaxed (pid is for people,
    // never for decisions).
    if (rc.state.load(std::memory_order_acquire) != detail::kRingClientActive) continue;
    RingClientStats cs;
    cs.slot = static_cast<uint32_t>(c);
    cs.pid = rc.pid.load(std::memory_order_relaxed);
    cs.alive = c == self;
    if (!cs.alive) {
      int r = detail::TryLockRobust(&rc.life);
      if (r == EOWNERDEAD) {
        RecoverOne(core, c);  // found dead: recovered, listed no more
        continue;
      }
      if (r == 0) pthread_mutex_unlock(&rc.life);  // leaving right now
      cs.alive = r == EBUSY;
    }
    cs.role = rc.role.load(std::memory_order_relaxed) == detail::kRoleTrainer ? RingRole::kTrainer
                                                                              : RingRole::kLoader;
    cs.acquired = rc.acquired.load(std::memory_order_relaxed);
    cs.published = rc.published.load(std::memory_order_relaxed);
    cs.abandoned = rc.abandoned.load(std::memory_order_relaxed);
    cs.popped = rc.popped.load(std::memory_order_relaxed);
    cs.released = rc.released.load(std::memory_order_relaxed);
    cs.wait_seconds = static_cast<double>(rc.wait_ns.load(std::memory_order_relaxed)) / 1e9;
    uint64_t since = rc.waiting_since_ns.load(std::memory_order_relaxed);
    if (since != 0 && since < s.now_ns)
      cs.waiting_seconds = static_cast<double>(s.now_ns - since) / 1e9;
    cs.joined_ns = rc.joined_ns.load(std::memory_order_relaxed);
    s.clients.push_back(cs);
  }
  return s;
}

}  // namespace

const char* RingStatusName(RingStatus status) noexcept {
  switch (status) {
    case RingStatus::kOk:
      return "ok";
    case RingStatus::kTimeout:
      return "timeout";
    case RingStatus::kEnd:
      return "end";
    case RingStatus::kClosed:
      return "closed";
    case RingStatus::kStale:
      return "stale";
    case RingStatus::kInvalid:
      return "invalid";
    case RingStatus::kCorrupt:
      return "corrupt";
    case RingStatus::kForked:
      return "forked";
  }
  return "?";
}

struct BatchRing::Impl {
  Impl(std::unique_ptr<detail::RingSegment> s, const detail::RingGeometry& g, RingRole r)
      : seg(std::move(s)), core(seg->base(), g), role(r) {}

  // Takes a client slot (admin mutex held). Throws when all are in use.
  void Register();
  void Leave() noexcept;
  // Registers the arena with CUDA when options and role ask for it, says
  // so in memory_state, and gives a notice for a GPU that refused.
  void PinArena(const BatchRingOptions& options);

  // Calls try_once until it returns something other than kTimeout (nothing
  // yet), sleeping on `seq` between tries, until the deadline.
  template <typename TryOnce>
  RingStatus Wait(detail::SharedAtomic<uint32_t>& seq, detail::SharedAtomic<uint32_t>& waiters,
                  Clock::time_point deadline, TryOnce try_once) noexcept;
  RingStatus Stale() noexcept {
    // relaxed: statistics only.
    core.counters().stale_tokens.fetch_add(1, std::memory_order_relaxed);
    return RingStatus::kStale;
  }
  detail::RingClient& me() const { return core.client(self); }

  std::unique_ptr<detail::RingSegment> seg;
  RingCore core;
  RingRole role;
  uint64_t self = detail::kNoClient;
  detail::LifeHolder holder;
  std::atomic<int64_t> last_check_ns{0};
  std::unique_ptr<detail::CudaHostRegistration> cuda;  // a trainer's, undone before unmapping
  std::string memory_state;
  detail::ProcessOwner owner;
};

void BatchRing::Impl::PinArena(const BatchRingOptions& options) {
  const detail::RingGeometry& g = core.geometry();
  const uint64_t arena_bytes = g.slot_stride * g.num_slots;
  memory_state = "arena: " + detail::FormatBytes(arena_bytes) + " (" + std::to_string(g.num_slots) +
                 " slots of " + detail::FormatBytes(g.slot_stride) + ")";
  if (role != RingRole::kTrainer || !options.cuda_register) return;
  // The arena only: the control part of the segment is never copied to a GPU.
  cuda = std::make_unique<detail::CudaHostRegistration>(seg->base() + g.arena, arena_bytes);
  if (cuda->pinned()) {
    memory_state += " + CUDA-pinned";
    return;
  }
  memory_state += "; not CUDA-pinned: " + cuda->problem();
  // A GPU the arena could not be registered with: once per process. A host
  // without a GPU is normal and stays silent.
  static std::atomic<bool> said{false};
  // relaxed: only one notice; nothing is published through the flag.
  if (cuda->no_gpu() || said.exchange(true, std::memory_order_relaxed)) return;
  std::string line = "tailcut batch ring '" + seg->name() +
                     "': arena not CUDA-pinned: " + cuda->problem() +
                     "; host-to-device copies of batches will be staged by the driver";
  try {
    if (options.on_notice) {
      options.on_notice(line);
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  } catch (...) {
    // A notice sink that throws loses its notice, not the ring.
  }
}

void BatchRing::Impl::Register() {
  const uint64_t n = core.geometry().max_clients;
  for (uint64_t c = 0; c < n; ++c) {
    detail::RingClient& rc = core.client(c);
    // acquire: pairs with the release stores of state in Register, Leave and RecoverOne; a filter
    // only, the trylock decides.
    if (rc.state.load(std::memory_order_acquire) == detail::kRingClientActive) {
      int r = detail::TryLockRobust(&rc.life);
      if (r == EOWNERDEAD) {
        RecoverOne(core, c);
      } else {
        if (r == 0) pthread_mutex_unlock(&rc.life);
        continue;
      }
    }
    if (!holder.Start(&rc.life)) continue;
    // relaxed: published by the release store of state below.
    for (auto* counter : {&rc.acquired, &rc.published, &rc.abandoned, &rc.popped, &rc.released,
                          &rc.wait_ns, &rc.left_ns, &rc.waiting_since_ns})
      counter->store(0, std::memory_order_relaxed);
    rc.role.store(role == RingRole::kTrainer ? detail::kRoleTrainer : detail::kRoleLoader,
                  std::memory_order_relaxed);
    rc.pid.store(::getpid(), std::memory_order_relaxed);
    rc.joined_ns.store(detail::MonotonicNs(), std::memory_order_relaxed);
    // Release pairs with the acquire loads of state in RecoverDead, Register, Leave and StatsOf:
    // whoever sees this client ACTIVE sees the fields above reset. clients_joined: a statistic.
    rc.state.store(detail::kRingClientActive, std::memory_order_release);
    core.counters().clients_joined.fetch_add(1, std::memory_order_relaxed);
    self = c;
    return;
  }
  throw Error(ErrorKind::kInvalidArgument,
              "batch ring '" + seg->name() + "': all " + std::to_string(n) +
                  " client slots are in use by live processes; open it with a larger max_clients "
                  "(after removing it) or run fewer loaders and trainers");
}

void BatchRing::Impl::Leave() noexcept {
  if (self == detail::kNoClient) return;
  // Our own slots go where a death would send them (R5): nothing leaks.
  uint64_t reclaimed = 0, redelivered = 0;
  core.RecoverClient(self, &reclaimed, &redelivered);
  detail::RingCounters& k = core.counters();
  // relaxed: statistics only.
  k.reclaimed.fetch_add(reclaimed, std::memory_order_relaxed);
  k.redelivered.fetch_add(redelivered, std::memory_order_relaxed);
  pthread_mutex_t* admin = &core.header().admin_mutex;
  bool died = false;
  bool locked = detail::LockRobustFor(admin, std::chrono::milliseconds(5000), &died) == 0;
  // release: pairs with the acquire loads of state in RecoverDead, Register, Leave and StatsOf; our
  // slots were moved on above (R5). left_ns: statistics only.
  me().state.store(detail::kRingClientFree, std::memory_order_release);
  me().left_ns.store(detail::MonotonicNs(), std::memory_order_relaxed);
  // acquire: pairs with EndEpoch's acq_rel CAS (Close). Below, acquire as in RecoverDead.
  bool last = k.ended_through_plus1.load(std::memory_order_acquire) == detail::kAllEpochs && locked;
  if (last) {
    for (uint64_t c = 0; c < core.geometry().max_clients && last; ++c) {
      if (c == self ||
          core.client(c).state.load(std::memory_order_acquire) != detail::kRingClientActive)
        continue;
      int r = detail::TryLockRobust(&core.client(c).life);
      if (r == EOWNERDEAD) {
        RecoverOne(core, c);
      } else {
        if (r == 0) pthread_mutex_unlock(&core.client(c).life);
        last = false;
      }
    }
  }
  if (last) seg->UnlinkIfSame();
  if (locked) pthread_mutex_unlock(admin);
  holder.Stop();
  self = detail::kNoClient;
  Wake(k.free_seq, k.free_waiters, INT_MAX);
  Wake(k.ready_seq, k.ready_waiters, INT_MAX);
}

template <typename TryOnce>
RingStatus BatchRing::Impl::Wait(detail::SharedAtomic<uint32_t>& seq,
                                 detail::SharedAtomic<uint32_t>& waiters,
                                 Clock::time_point deadline, TryOnce try_once) noexcept {
  RingStatus st = try_once();
  for (int i = 0; i < kSpins && st == RingStatus::kTimeout; ++i) {
    for (int p = 0; p < 16; ++p) __builtin_ia32_pause();
    st = try_once();
  }
  if (st != RingStatus::kTimeout) return st;
  auto start = Clock::now();
  auto now = start;
  // relaxed: a statistic for Stats (tailcut top), read by no decision.
  uint64_t since = detail::MonotonicNs();
  me().waiting_since_ns.store(since, std::memory_order_relaxed);
  for (;;) {
    if (now >= deadline) break;
    int64_t now_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
    // relaxed: a process-local rate limit for RecoverDead; a race only checks twice.
    if (now_ns - last_check_ns.load(std::memory_order_relaxed) >=
        std::chrono::nanoseconds(kCheckEvery).count()) {
      last_check_ns.store(now_ns, std::memory_order_relaxed);
      RecoverDead(core, self);
    }
    // Acquire pairs with the waker's increment: a change made before it is
    // seen by the try below, or the futex sees the new value and returns.
    uint32_t s = seq.load(std::memory_order_acquire);
    // seq_cst: pairs with Wake's seq_cst load of waiters (with the fences).
    waiters.fetch_add(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);  // pairs with the fence in Wake
    st = try_once();
    if (st == RingStatus::kTimeout) {
      auto slice = std::min<Clock::duration>(deadline - now, kCheckEvery);
      FutexWait(&seq, s, std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count());
    }
    // seq_cst (relaxed would do): a waker that still counts us only makes one futex call too many.
    waiters.fetch_sub(1, std::memory_order_seq_cst);
    if (st != RingStatus::kTimeout) break;
    now = Clock::now();
  }
  // relaxed: statistics only. The CAS clears only our own start: another
  // thread of this client may have started a wait since.
  me().wait_ns.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count(),
      std::memory_order_relaxed);
  me().waiting_since_ns.compare_exchange_strong(since, 0, std::memory_order_relaxed);
  return st;
}

BatchRing::BatchRing(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

BatchRing::~BatchRing() {
  if (impl_->owner.forked()) {
    // A forked child's copy: the client slot, its life mutex's holder thread
    // and the CUDA registration are the parent's. Unmap, leak the rest.
    impl_.release()->seg.reset();
    return;
  }
  impl_->cuda.reset();  // while the arena is still mapped
  impl_->Leave();
}

std::unique_ptr<BatchRing> BatchRing::Open(const BatchRingOptions& o, RingRole role) {
  detail::ValidateQueueName(o.name, "batch ring name");
  auto invalid = [&](const std::string& what) {
    return Error(ErrorKind::kInvalidArgument, "batch ring '" + o.name + "': " + what);
  };
  if (o.num_slots == 0 || o.num_slots > detail::kMaxRingSlots)
    throw invalid("num_slots is " + std::to_string(o.num_slots) + "; use 1 to " +
                  std::to_string(detail::kMaxRingSlots));
  if (o.max_clients == 0 || o.max_clients > detail::kMaxRingClients)
    throw invalid("max_clients is " + std::to_string(o.max_clients) + "; use 1 to " +
                  std::to_string(detail::kMaxRingClients));
  if (o.slot_bytes == 0 || o.slot_bytes > (uint64_t{1} << 36))
    throw invalid("slot_bytes is " + std::to_string(o.slot_bytes) + "; use 1 byte to 64 GiB");
  detail::RingGeometry g = detail::ComputeRingGeometry(o.slot_bytes, o.num_slots, o.max_clients);
  uint64_t fingerprint = Fingerprint(o.slot_bytes, o.num_slots, o.max_clients);

  for (int attempt = 0;; ++attempt) {
    if (auto seg = detail::RingSegment::CreateExclusive(o.name, g.total)) {
      auto& h = *reinterpret_cast<detail::RingHeader*>(seg->base());  // zeroed by fallocate
      detail::InitRobustMutex(&h.admin_mutex);
      h.layout_version = detail::kRingLayoutVersion;
      h.total_size = g.total;
      // Release pairs with the attacher's acquire of magic: the mutex exists.
      h.magic.store(detail::kRingMagic, std::memory_order_release);
      bool died = false;
      detail::LockRobustFor(&h.admin_mutex, std::chrono::milliseconds(5000), &died);
      h.creator_uid = ::geteuid();
      h.creator_pid = ::getpid();
      h.created_unix_ns = detail::RealtimeNs();
      h.fingerprint = fingerprint;
      h.slot_bytes = o.slot_bytes;
      h.num_slots = o.num_slots;
      h.max_clients = o.max_clients;
      h.ring_cells = g.ring_cells;
      RingCore::Initialize(seg->base(), g);
      RingCore core(seg->base(), g);
      for (uint64_t c = 0; c < g.max_clients; ++c) detail::InitRobustMutex(&core.client(c).life);
      // READY last: release pairs with the attacher's acquire of state.
      h.state.store(detail::kRingReady, std::memory_order_release);
      auto impl = std::make_unique<Impl>(std::move(seg), g, role);
      try {
        impl->Register();
      } catch (...) {
        pthread_mutex_unlock(&h.admin_mutex);
        throw;
      }
      pthread_mutex_unlock(&h.admin_mutex);
      std::unique_ptr<BatchRing> ring(new BatchRing(std::move(impl)));
      ring->impl_->PinArena(o);  // not under the admin lock: loading CUDA takes a while
      return ring;
    }
    std::unique_ptr<detail::RingSegment> seg;
    try {
      seg = detail::RingSegment::OpenExisting(o.name, sizeof(detail::RingHeader), o.attach_timeout);
    } catch (const Error& e) {
      // Removed between our create and open: create again.
      if (e.kind() == ErrorKind::kNotFound && attempt < 5) continue;
      throw;
    }
    auto& h = *reinterpret_cast<detail::RingHeader*>(seg->base());
    auto deadline = std::chrono::steady_clock::now() + o.attach_timeout;
    // Acquire pairs with the creator's release of magic, then of READY.
    while (h.magic.load(std::memory_order_acquire) != detail::kRingMagic ||
           h.state.load(std::memory_order_acquire) != detail::kRingReady) {
      uint64_t m = h.magic.load(std::memory_order_acquire);
      if (m != 0 && m != detail::kRingMagic) break;  // garbage: CheckSegment names it
      if (std::chrono::steady_clock::now() >= deadline)
        throw Error(ErrorKind::kTimeout,
                    "batch ring '" + o.name + "': " + seg->path() + " was not made ready within " +
                        std::to_string(o.attach_timeout.count()) +
                        " ms (its creator probably died); remove it (RemoveBatchRing) and start "
                        "again");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    detail::RingGeometry found = CheckSegment(*seg);
    auto mismatch = [&](const char* field, uint64_t here, uint64_t there) {
      return Error(ErrorKind::kConfigMismatch,
                   "batch ring '" + o.name + "' exists with a different configuration: " + field +
                       " differs: " + std::to_string(here) + " here, " + std::to_string(there) +
                       " in " + seg->path() +
                       ". Use the same options in every process, or another name (remove the old "
                       "ring with RemoveBatchRing once its processes are gone)");
    };
    if (h.slot_bytes != o.slot_bytes) throw mismatch("slot_bytes", o.slot_bytes, h.slot_bytes);
    if (h.num_slots != o.num_slots) throw mismatch("num_slots", o.num_slots, h.num_slots);
    if (h.max_clients != o.max_clients) throw mismatch("max_clients", o.max_clients, h.max_clients);
    bool died = false;
    if (detail::LockRobustFor(&h.admin_mutex, o.attach_timeout, &died) != 0)
      throw Error(ErrorKind::kTimeout, "batch ring '" + o.name + "': its admin lock in " +
                                           seg->path() + " was not free within " +
                                           std::to_string(o.attach_timeout.count()) + " ms");
    auto impl = std::make_unique<Impl>(std::move(seg), found, role);
    try {
      impl->Register();
    } catch (...) {
      pthread_mutex_unlock(&h.admin_mutex);
      throw;
    }
    pthread_mutex_unlock(&h.admin_mutex);
    // Adopt a stale ring: slots of clients that died are recovered now.
    RecoverDead(impl->core, impl->self);
    std::unique_ptr<BatchRing> ring(new BatchRing(std::move(impl)));
    ring->impl_->PinArena(o);
    return ring;
  }
}

RingStatus BatchRing::AcquireSlot(WritableBatch* out, Deadline deadline) noexcept {
  Impl& d = *impl_;
  if (d.owner.forked()) return RingStatus::kForked;
  if (d.role != RingRole::kLoader) return RingStatus::kInvalid;
  detail::RingCounters& k = d.core.counters();
  return d.Wait(k.free_seq, k.free_waiters, deadline, [&] {
    uint32_t slot = 0;
    uint64_t gen = 0;
    RingStatus st = FromCore(d.core.TakeFree(d.self, &slot, &gen));
    if (st != RingStatus::kOk) return st;
    out->token = {slot, gen};
    out->data = {reinterpret_cast<std::byte*>(d.core.slot_data(slot)),
                 d.core.geometry().slot_bytes};
    out->user_header = {reinterpret_cast<std::byte*>(d.core.slot(slot).user_header),
                        detail::kUserHeaderBytes};
    d.me().acquired.fetch_add(1, std::memory_order_relaxed);  // relaxed: statistics only.
    return st;
  });
}

RingStatus BatchRing::Publish(const SlotToken& token, uint64_t epoch, uint64_t records,
                              uint64_t bytes) noexcept {
  Impl& d = *impl_;
  if (d.owner.forked()) return RingStatus::kForked;
  if (d.role != RingRole::kLoader || bytes > d.core.geometry().slot_bytes || epoch == kAllEpochs)
    return RingStatus::kInvalid;
  if (token.slot >= d.core.geometry().num_slots) return d.Stale();
  detail::SlotHeader& sh = d.core.slot(token.slot);
  // acquire: pairs with the CAS in RingCore::Pop (TakeFree) that made the slot FILLING for us; only
  // a check of our token.
  if (sh.word.load(std::memory_order_acquire) !=
      detail::SlotWord(detail::kSlotFilling, d.self, token.generation))
    return d.Stale();
  detail::RingCounters& k = d.core.counters();
  // acquire: pairs with EndEpoch's acq_rel CAS: no batch of an ended epoch is published.
  if (epoch + 1 <= k.ended_through_plus1.load(std::memory_order_acquire))
    return RingStatus::kClosed;
  // Relaxed: published by the release CAS of the ring cell (RingCore::Push).
  sh.epoch.store(epoch, std::memory_order_relaxed);
  sh.records.store(records, std::memory_order_relaxed);
  sh.bytes.store(bytes, std::memory_order_relaxed);
  sh.loader.store(d.self, std::memory_order_relaxed);
  RingStatus st = FromCore(d.core.Publish(d.self, token.slot, token.generation));
  if (st == RingStatus::kStale) return d.Stale();
  if (st != RingStatus::kOk) return st;
  // relaxed: statistics only.
  k.published.fetch_add(1, std::memory_order_relaxed);
  d.me().published.fetch_add(1, std::memory_order_relaxed);
  Wake(k.ready_seq, k.ready_waiters, 1);
  return st;
}

RingStatus BatchRing::Abandon(const SlotToken& token) noexcept {
  Impl& d = *impl_;
  if (d.owner.forked()) return RingStatus::kForked;
  if (d.role != RingRole::kLoader) return RingStatus::kInvalid;
  RingStatus st = FromCore(d.core.Abandon(d.self, token.slot, token.generation));
  if (st == RingStatus::kStale) return d.Stale();
  if (st != RingStatus::kOk) return st;
  d.me().abandoned.fetch_add(1, std::memory_order_relaxed);  // relaxed: statistics only.
  Wake(d.core.counters().free_seq, d.core.counters().free_waiters, 1);
  return st;
}

RingStatus BatchRing::Pop(uint64_t through_epoch, ReadyBatch* out, Deadline deadline) noexcept {
  Impl& d = *impl_;
  if (d.owner.forked()) return RingStatus::kForked;
  if (d.role != RingRole::kTrainer) return RingStatus::kInvalid;
  detail::RingCounters& k = d.core.counters();
  return d.Wait(k.ready_seq, k.ready_waiters, deadline, [&] {
    // Read the end mark before looking at the ring: acquire pairs with
    // EndEpoch's release, made after the last batch of the epoch was pushed.
    uint64_t ended = k.ended_through_plus1.load(std::memory_order_acquire);
    uint32_t slot = 0;
    uint64_t gen = 0;
    RingStatus st = FromCore(d.core.TakeReady(d.self, &slot, &gen));
    if (st == RingStatus::kTimeout && Ended(ended, through_epoch)) {
      // A trainer that died holding a batch gives it back only when its
      // death is found: look before declaring the end (R5).
      RecoverDead(d.core, d.self);
      st = FromCore(d.core.TakeReady(d.self, &slot, &gen));
      if (st == RingStatus::kTimeout) return RingStatus::kEnd;
    }
    if (st != RingStatus::kOk) return st;
    detail::SlotHeader& sh = d.core.slot(slot);
    // relaxed: written by the loader before its push; TakeReady acquired the pushed cell, so they
    // are visible (epoch and records below too).
    uint64_t bytes = sh.bytes.load(std::memory_order_relaxed);
    uint64_t loader = sh.loader.load(std::memory_order_relaxed);
    if (bytes > d.core.geometry().slot_bytes) {
      // Never hand out a span past the slot; give the slot back.
      d.core.Release(d.self, slot, gen);
      return RingStatus::kCorrupt;
    }
    out->token = {slot, gen};
    out->data = {reinterpret_cast<const std::byte*>(d.core.slot_data(slot)), bytes};
    out->user_header = {reinterpret_cast<const std::byte*>(sh.user_header),
                        detail::kUserHeaderBytes};
    out->epoch = sh.epoch.load(std::memory_order_relaxed);
    out->records = sh.records.load(std::memory_order_relaxed);
    out->loader = static_cast<uint32_t>(loader);
    d.me().popped.fetch_add(1, std::memory_order_relaxed);  // relaxed: statistics only.
    return st;
  });
}

int BatchRing::PeekReady(const std::function<void(const ReadyBatch&)>& fn) const {
  const Impl& d = *impl_;
  int moved = 0;
  for (uint32_t i = 0; i < d.core.geometry().num_slots; ++i) {
    detail::SlotHeader& sh = d.core.slot(i);
    // acquire: pairs with the acq_rel CAS that made the slot READY (MoveOwned, or a recovery):
    // the loader's writes to the header and the data before it are visible.
    uint64_t w = sh.word.load(std::memory_order_acquire);
    if (detail::SlotStateOf(w) != detail::kSlotReady) continue;
    d.core.AnnounceTaken(i);
    ReadyBatch b;
    // relaxed: ordered by the acquire above.
    uint64_t bytes = sh.bytes.load(std::memory_order_relaxed);
    b.token = {i, detail::SlotGenOf(w)};
    b.data = {reinterpret_cast<const std::byte*>(d.core.slot_data(i)),
              std::min(bytes, d.core.geometry().slot_bytes)};  // never past the slot
    b.user_header = {reinterpret_cast<const std::byte*>(sh.user_header), detail::kUserHeaderBytes};
    b.epoch = sh.epoch.load(std::memory_order_relaxed);
    b.records = sh.records.load(std::memory_order_relaxed);
    b.loader = static_cast<uint32_t>(sh.loader.load(std::memory_order_relaxed));
    fn(b);
    // acquire: a pop (acq_rel CAS) while fn read means the read may be torn.
    if (sh.word.load(std::memory_order_acquire) != w) ++moved;
  }
  return moved;
}

RingStatus BatchRing::Release(const SlotToken& token) noexcept {
  Impl& d = *impl_;
  if (d.owner.forked()) return RingStatus::kForked;
  if (d.role != RingRole::kTrainer) return RingStatus::kInvalid;
  RingStatus st = FromCore(d.core.Release(d.self, token.slot, token.generation));
  if (st == RingStatus::kStale) return d.Stale();
  if (st != RingStatus::kOk) return st;
  detail::RingCounters& k = d.core.counters();
  // relaxed: statistics only.
  k.released.fetch_add(1, std::memory_order_relaxed);
  d.me().released.fetch_add(1, std::memory_order_relaxed);
  Wake(k.free_seq, k.free_waiters, 1);
  return st;
}

void BatchRing::EndEpoch(uint64_t epoch) noexcept {
  if (impl_->owner.forked()) return;  // the parent's to end
  detail::RingCounters& k = impl_->core.counters();
  uint64_t mark = epoch == kAllEpochs ? detail::kAllEpochs : epoch + 1;
  // acquire: pairs with other EndEpoch CASes; only the start value for the CAS below.
  uint64_t cur = k.ended_through_plus1.load(std::memory_order_acquire);
  // Release pairs with Pop's acquire: batches pushed before are seen.
  while (cur < mark && !k.ended_through_plus1.compare_exchange_weak(
                           cur, mark, std::memory_order_acq_rel, std::memory_order_acquire)) {
  }
  Wake(k.ready_seq, k.ready_waiters, INT_MAX);
}

void BatchRing::Close() noexcept { EndEpoch(kAllEpochs); }

int BatchRing::RecoverDeadClients() noexcept {
  return impl_->owner.forked() ? 0 : RecoverDead(impl_->core, impl_->self);
}

BatchRingStats BatchRing::Stats() const {
  impl_->owner.CheckNotForked("batch ring '" + impl_->seg->name() + "'", "BatchRing");
  return StatsOf(impl_->core, *impl_->seg, impl_->self);
}
bool BatchRing::cuda_pinned() const noexcept { return impl_->cuda && impl_->cuda->pinned(); }
const std::string& BatchRing::memory_state() const noexcept { return impl_->memory_state; }
uint32_t BatchRing::client_slot() const noexcept { return static_cast<uint32_t>(impl_->self); }
uint64_t BatchRing::slot_bytes() const noexcept { return impl_->core.geometry().slot_bytes; }
uint32_t BatchRing::num_slots() const noexcept { return impl_->core.geometry().num_slots; }

BatchRingStats InspectBatchRing(const std::string& name) {
  detail::ValidateQueueName(name, "batch ring name");
  auto seg = detail::RingSegment::OpenExisting(name, sizeof(detail::RingHeader),
                                               std::chrono::milliseconds(0));
  auto& h = *reinterpret_cast<detail::RingHeader*>(seg->base());
  // acquire: pairs with the creator's release stores of state and magic (Open).
  if (h.state.load(std::memory_order_acquire) != detail::kRingReady &&
      h.magic.load(std::memory_order_acquire) == detail::kRingMagic)
    throw Error(ErrorKind::kTimeout, "batch ring '" + name + "' is still being created");
  RingCore core(seg->base(), CheckSegment(*seg));
  RecoverDead(core, detail::kNoClient);
  return StatsOf(core, *seg, detail::kNoClient);
}

bool RemoveBatchRing(const std::string& name) {
  detail::ValidateQueueName(name, "batch ring name");
  return detail::RingSegment::Remove(name);
}

std::string BatchRingSegmentPath(const std::string& name) {
  detail::ValidateQueueName(name, "batch ring name");
  return detail::RingSegment::PathOf(name);
}

}  // namespace tailcut
