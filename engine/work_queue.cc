#include "tailcut/work_queue.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "engine/checkpoint.h"
#include "engine/clock.h"
#include "engine/config.h"
#include "engine/crash_point.h"
#include "engine/feeder.h"
#include "engine/futex.h"
#include "engine/handle_checks.h"
#include "engine/housekeeper.h"
#include "engine/lease.h"
#include "engine/local_feed.h"
#include "engine/resume_point.h"
#include "engine/robust_mutex.h"
#include "engine/segment.h"
#include "engine/segment_config.h"
#include "engine/state_scan.h"
#include "engine/step_barrier.h"

namespace tailcut {

using namespace detail;

namespace {

constexpr uint64_t kHousekeepingNs = 100'000'000;  // dead-client checks while busy
constexpr uint64_t kWaitSliceNs = 50'000'000;      // longest futex sleep: deaths wake nobody
constexpr uint64_t kWaitNoticeNs = 30'000'000'000;

void DefaultNotice(const std::string& line) { std::fprintf(stderr, "tailcut: %s\n", line.c_str()); }

uint64_t DataFingerprint(QueueConfig config) {
  config.seed_explicit = false;  // the seed is compared on its own
  return config.Fingerprint();
}

}  // namespace

class WorkQueue::Impl {
 public:
  Impl(WorkQueueOptions options, QueueConfig config)
      : options_(std::move(options)), config_(std::move(config)) {
    if (!options_.on_notice) options_.on_notice = DefaultNotice;
  }
  ~Impl() { Close(); }

  void Open();
  TakeStatus Take(WorkItem* item, bool wait,
                  std::chrono::steady_clock::time_point deadline) noexcept;
  TakeStatus TakeSplit(WorkItem* out, uint64_t below_epoch) noexcept {
    if (closed_) return TakeStatus::kClosed;
    const uint64_t n = table_->num_items();
    const uint64_t below = below_epoch >= UINT64_MAX / n ? UINT64_MAX : below_epoch * n;
    return leases_->TrySplit(out, below) ? TakeStatus::kOk : TakeStatus::kTimeout;
  }
  // The item calls: kInvalid unless the queue is open and its table has the
  // item's lease; then the lease's transition (lease.h).
  ItemStatus Ack(const WorkItem& item) noexcept {
    return Valid(item) ? leases_->Ack(item) : ItemStatus::kInvalid;
  }
  ItemStatus GiveBack(const WorkItem& item) noexcept {
    return Valid(item) ? leases_->GiveBack(item) : ItemStatus::kInvalid;
  }
  ItemStatus Progress(const WorkItem& item, uint64_t offset, uint64_t records) noexcept {
    return Valid(item) ? leases_->Progress(item, offset, records) : ItemStatus::kInvalid;
  }
  ItemStatus Commit(const WorkItem& item, uint64_t offset) noexcept {
    return Valid(item) ? leases_->Commit(item, offset) : ItemStatus::kInvalid;
  }
  ItemStatus Claim(const WorkItem& item, uint64_t up_to, uint64_t* end) noexcept {
    return Valid(item) ? leases_->Claim(item, up_to, end) : ItemStatus::kInvalid;
  }
  StepStatus AgreeStep(uint32_t rank, uint32_t ranks, uint64_t step, bool has_batch,
                       std::chrono::steady_clock::time_point deadline) noexcept;
  std::string SaveState() const;
  std::string SaveHostState() const;
  std::string SaveStateWithHosts(const std::vector<std::string>& host_states) const {
    if (!feeder_)
      throw Error(ErrorKind::kInvalidArgument,
                  "queue '" + options_.name +
                      "' is not fed by a coordinator: its SaveState() is the whole job's");
    return feeder_->SaveStateWithHosts(host_states);
  }
  QueueStats Stats() const { return keeper_->Stats(options_.name); }
  std::string JobLossMessage() const { return closed_ || !feeder_ ? "" : feeder_->LossMessage(); }
  uint64_t SettledTickets(uint64_t from) const noexcept { return keeper_->SettledPrefix(from); }
  void Close() noexcept;

  const std::string& name() const { return options_.name; }
  std::chrono::milliseconds lease_timeout() const {
    return std::chrono::milliseconds(timeout_ns_ / 1000000);
  }
  const QueueConfig& config() const { return config_; }
  const LeaseTable& table() const { return *table_; }
  bool closed() const { return closed_; }
  void UnmapForked() noexcept { segment_.reset(); }
  HandleChecks handle;  // fork, second acks, Dependents: the public calls use it
  // An item call behind the handle's checks (handle_checks.h).
  template <typename Call>
  ItemStatus ItemCall(const WorkItem& item, bool finishes, Call call) noexcept {
    ItemStatus s = handle.Check(item, closed_);
    return s != ItemStatus::kOk
               ? s
               : handle.Explain(item, call(), finishes,
                                timeout_ns_ > 0 || options_.stop_timeout.count() > 0);
  }

 private:
  void Notice(const std::string& line) const {
    try {
      options_.on_notice(line);
    } catch (...) {
    }
  }
  // One attempt to create or attach. Returns false to retry from scratch.
  bool TryCreate(const Geometry& g);
  bool TryAttach();
  void Register();  // admin held
  bool Valid(const WorkItem& item) const noexcept {
    return !closed_ && item.lease < table_->num_leases();
  }
  void ApplyRestore(const SavedState& state);
  // Makes the table and its housekeeper over segment_.
  void MakeTable(std::vector<WorkQueue::Item> items, uint64_t num_epochs, uint64_t seed,
                 bool shuffle);
  void Housekeep() noexcept;
  ClientEntry& me() const { return segment_->client(slot_); }

  WorkQueueOptions options_;
  QueueConfig config_;
  std::unique_ptr<Segment> segment_;
  std::unique_ptr<LeaseTable> table_;
  std::unique_ptr<Housekeeper> keeper_;
  std::unique_ptr<ClientLeases> leases_;  // once registered
  LifeHolder holder_;
  SavedState restore_;
  uint64_t slot_ = kNoOwner;
  uint64_t timeout_ns_ = 0;
  // How often a busy Take looks after others, and the longest sleep at the
  // end of the data: half a short lease timeout, so that it is acted on in
  // time, else kHousekeepingNs and kWaitSliceNs.
  uint64_t housekeeping_ns_ = kHousekeepingNs;
  uint64_t wait_slice_ns_ = kWaitSliceNs;
  std::atomic<uint64_t> next_housekeeping_ns_{0};
  // A job across hosts: the tier's feeder (its thread runs while open) and
  // the queue's side of it.
  std::unique_ptr<Feeder> feeder_;
  std::unique_ptr<LocalFeed> feed_;
  // The format's record size when the queue's format tag is "fixed:N" (0:
  // any other format): offsets passed to Progress and Commit must be record
  // boundaries.
  uint64_t record_bytes_ = 0;
  bool closed_ = true;
};

void WorkQueue::Impl::Open() {
  LoadCrashPointFromEnvironment();
  record_bytes_ = FixedRecordBytes(config_.format);
  // A job across hosts: the tier decides the seed, and this host's queue
  // gets a name of its own (so hosts can also be simulated on one machine).
  FeedJob job{options_.name,         config_.items.size(), config_.num_epochs,
              config_.seed_explicit, config_.seed,         DataFingerprint(config_)};
  feeder_ = OpenFeeder(options_, job);
  if (feeder_) {
    config_.fed = true;
    config_.seed = feeder_->seed();
    config_.seed_explicit = true;
    options_.name.append(".").append(ResolveHostId(options_));
    // The tier's state the feeder restored; an exact checkpoint also holds
    // this host's queue's own, restored below.
    options_.restore_state = IsFedRestore(options_.restore_state)
                                 ? DeserializeFedRestore(options_.name, options_.restore_state).host
                                 : std::string();
  } else if (IsFedRestore(options_.restore_state)) {
    throw Error(ErrorKind::kInvalidArgument,
                "queue '" + options_.name +
                    "': restore_state is a checkpoint of a job across hosts, fed by a "
                    "coordinator, but no coordinator is set: set it (coordinator, or "
                    "TAILCUT_COORDINATOR) as when the checkpoint was saved");
  }
  if (!options_.restore_state.empty()) {
    // Check the state before touching shared memory.
    restore_ = DeserializeState(options_.name, options_.restore_state);
    auto mismatch = [&](const std::string& what) {
      return Error(ErrorKind::kConfigMismatch,
                   "queue '" + options_.name + "': restore_state " +
                       "was saved from a different configuration: " + what);
    };
    if (restore_.num_items != config_.items.size())
      throw mismatch("it has " + std::to_string(restore_.num_items) + " items, this queue " +
                     std::to_string(config_.items.size()));
    if (restore_.num_epochs != config_.num_epochs)
      throw mismatch("num_epochs " + std::to_string(restore_.num_epochs) + " there, " +
                     std::to_string(config_.num_epochs) + " here");
    if (config_.seed_explicit && restore_.seed != config_.seed)
      throw mismatch("seed " + std::to_string(restore_.seed) + " there, " +
                     std::to_string(config_.seed) + " here");
    if (restore_.fingerprint != DataFingerprint(config_))
      throw mismatch(
          "works (of an index work: its samples_id, e.g. the record files of "
          "QueueDataset(shuffle='global')), file sizes, num_slices, shuffle, the shuffle order's "
          "version (a checkpoint of a tailcut older than this one's order) or format differ");
  }
  uint64_t path_bytes = 0;
  for (const auto& p : config_.paths) path_bytes += p.size();
  Geometry g =
      ComputeGeometry(config_.paths.size(), config_.items.size(), config_.total_tickets(),
                      path_bytes, config_.max_clients, config_.leases_per_client, config_.fed);
  if (g.total == 0)
    throw Error(ErrorKind::kInvalidArgument,
                "queue '" + options_.name + "': configuration too large");
  for (int attempt = 0; attempt < 16; ++attempt) {
    if (TryCreate(g) || TryAttach()) {
      // The queue's lease timeout, as the segment holds it.
      timeout_ns_ = segment_->header().lease_timeout_ms * 1000000ull;
      if (timeout_ns_ > 0) {
        housekeeping_ns_ = std::clamp<uint64_t>(timeout_ns_ / 2, 1'000'000, kHousekeepingNs);
        wait_slice_ns_ = std::min(wait_slice_ns_, housekeeping_ns_);
      }
      closed_ = false;
      if (feeder_) {
        feed_ = std::make_unique<LocalFeed>(segment_.get(), table_.get());
        try {
          feeder_->Start(feed_.get());
        } catch (...) {
          Close();
          throw;
        }
      }
      return;
    }
  }
  throw Error(
      ErrorKind::kTimeout,
      "queue '" + options_.name +
          "': gave up after 16 attempts to create "
          "or join it while other processes kept replacing it; retry, or pick another name");
}

bool WorkQueue::Impl::TryCreate(const Geometry& g) {
  segment_ = Segment::CreateExclusive(options_.name, g.total);
  if (!segment_) return false;
  Header& h = segment_->header();
  InitRobustMutex(&h.admin_mutex);
  RobustLock admin(&segment_->header().admin_mutex);
  bool died;
  admin.Lock(options_.attach_timeout, &died);
  CrashPoint("create.after_mutex");
  h.layout_version = kLayoutVersion;
  h.total_size = g.total;
  // release: pairs with the attacher's acquire loads of magic in
  // WaitForMagic and CheckPreamble (segment.cc): the mutex and the preamble
  // above are visible before it touches them.
  h.magic.store(kSegmentMagic, std::memory_order_release);

  bool restoring = !options_.restore_state.empty();
  if (restoring) {
    config_.seed = restore_.seed;
  } else if (!config_.seed_explicit) {
    uint64_t seed = 0;
    if (::getrandom(&seed, sizeof(seed), 0) != sizeof(seed)) seed = MonotonicNs() ^ ::getpid();
    config_.seed = seed;
  }
  WriteLayout(segment_.get(), config_, g);
  h.lease_timeout_ms = static_cast<uint64_t>(options_.lease_timeout.count());
  MakeTable(config_.items, config_.num_epochs, config_.seed, config_.shuffle);
  if (restoring) {
    try {
      ApplyRestore(restore_);
    } catch (...) {
      segment_->UnlinkIfSame();
      throw;
    }
    // A fed queue's is the tier's run instead (LocalFeed::BindRun).
    if (!config_.fed)
      h.restore_hash = HashBytes(options_.restore_state.data(), options_.restore_state.size()) | 1;
  }
  if (options_.keep_unfinished)
    segment_->counters().keep_reasons.store(kKeepRequested, std::memory_order_relaxed);
  CrashPoint("create.before_ready");
  // release: pairs with the acquire load of state in AttachSegment
  // (segment.cc): a joiner that sees READY sees the configuration, tables and
  // restored state written above.
  h.state.store(kReady, std::memory_order_release);
  Register();
  return true;
}

void WorkQueue::Impl::MakeTable(std::vector<WorkQueue::Item> items, uint64_t num_epochs,
                                uint64_t seed, bool shuffle) {
  table_ =
      std::make_unique<LeaseTable>(segment_.get(), std::move(items), num_epochs, seed, shuffle);
  keeper_ = std::make_unique<Housekeeper>(table_.get());
}

void WorkQueue::Impl::ApplyRestore(const SavedState& s) {
  Segment& seg = *segment_;
  uint64_t first_word = s.low / 64;
  for (uint64_t i = 0; i < first_word; ++i)
    seg.done_word(i).store(~uint64_t{0}, std::memory_order_relaxed);
  for (uint64_t i = 0; i < s.words.size(); ++i) {
    uint64_t bits = s.words[i];
    // Bits (and below, pieces) past the cursor mean nothing, though states
    // saved by older builds have some: their tickets are handed out again.
    if (i + 1 == s.words.size() && s.cursor % 64 != 0) bits &= (uint64_t{1} << (s.cursor % 64)) - 1;
    seg.done_word(first_word + i).store(bits, std::memory_order_relaxed);
  }
  uint64_t lease = 0;
  for (const Piece& p : s.pieces) {
    if (p.ticket >= s.cursor) continue;
    const WorkQueue::Item& item = table_->ItemOf(p.ticket);
    if (p.begin < item.begin || p.end > item.end)
      throw Error(ErrorKind::kCorrupt, "queue '" + options_.name +
                                           "': restore_state has a piece of "
                                           "ticket " +
                                           std::to_string(p.ticket) + " outside its item");
    if (p.begin < p.end && !IsResumableOffset(p.begin, item.begin, record_bytes_))
      throw Error(ErrorKind::kCorrupt,
                  "queue '" + options_.name + "': restore_state resumes ticket " +
                      std::to_string(p.ticket) + " at offset " + std::to_string(p.begin) +
                      ", inside a record of format '" + config_.format + "' (records start at " +
                      "multiples of " + std::to_string(record_bytes_) +
                      "); pass the bytes SaveState() returned, unchanged");
    seg.done_word(p.ticket / 64)
        .fetch_or(uint64_t{1} << (p.ticket % 64), std::memory_order_relaxed);
    if (p.begin >= p.end) continue;  // consumed to its end: done
    if (lease >= table_->num_leases())
      throw Error(ErrorKind::kInvalidArgument, "queue '" + options_.name + "': restore_state has " +
                                                   std::to_string(s.pieces.size()) +
                                                   " open items but this queue has room for " +
                                                   std::to_string(table_->num_leases()) +
                                                   "; raise max_clients or leases_per_client");
    uint64_t w = seg.lease(lease).word.load(std::memory_order_relaxed);
    table_->PublishOrphan(lease, w, p.ticket, p.begin, p.end, kLeasePreset);
    ++lease;
  }
  // release: pairs with the acquire loads of the cursor in AllDone, TrySweep,
  // Stats (housekeeper.cc) and SaveState. Joiners see all of the above through
  // TryCreate's release store of READY in any case.
  seg.cursor().next_ticket.store(s.low, std::memory_order_release);
}

bool WorkQueue::Impl::TryAttach() {
  Attachment a = AttachSegment(options_.name, AttachMode::kJoin, options_.attach_timeout);
  switch (a.state) {
    case AttachState::kAttached:
      break;
    case AttachState::kNotFound:  // removed meanwhile: create it
      return false;
    case AttachState::kUnsized:
      if (a.segment->UnlinkIfSame())
        Notice("queue '" + options_.name +
               "': removed an empty segment left by a creator that died");
      return false;
    case AttachState::kUnpublished:
      if (a.segment->UnlinkIfSame())
        Notice("queue '" + options_.name +
               "': removed a segment whose creator died before setting it up");
      return false;
    case AttachState::kRemoved:
      // Its remover unlinks it right after marking it, unless it was killed
      // in between: finish the removal (UnlinkIfSame is safe to repeat), or
      // every later Open would find this segment again.
      a.segment->UnlinkIfSame();
      return false;
    case AttachState::kCreating:
      a.segment->UnlinkIfSame();
      // release: as in `replace` below.
      a.segment->header().state.store(kRemoved, std::memory_order_release);
      Notice("queue '" + options_.name +
             "': replaced a segment whose creator died while setting it up");
      return false;
  }
  segment_ = std::move(a.segment);
  Header& h = segment_->header();
  RobustLock& admin = *a.admin;
  MakeTable(ReadItems(*segment_), h.num_epochs, h.seed, h.shuffle != 0);
  int live = keeper_->LiveClients(kNoOwner, /*admin_held=*/true);
  auto replace = [&](const std::string& why) {
    segment_->UnlinkIfSame();
    // release: pairs with the acquire load of state in AttachSegment
    // (segment.cc) of a process that opened the object before the unlink: it
    // sees REMOVED and starts over.
    h.state.store(kRemoved, std::memory_order_release);
    Notice("queue '" + options_.name + "': " + why);
    keeper_.reset();
    table_.reset();
    admin.Unlock();
    segment_.reset();
    return false;
  };
  if (live == 0) {
    try {
      CompareConfig(*segment_, config_);
    } catch (const Error& e) {
      return replace(
          "replacing a stale queue (all its processes are gone) made with another "
          "configuration: " +
          std::string(e.what()).substr(0, std::string(e.what()).find(". Use")));
    }
    QueueStats st = keeper_->Stats(options_.name);
    // A queue started from this same state belongs to this job (its first
    // processes may have finished before we came): join it. A fed queue's
    // restore starts a run of the tier's job of its own (FedRestoreState's
    // token): a stale queue there is an earlier run's.
    if (!options_.restore_state.empty() &&
        (config_.fed ||
         h.restore_hash !=
             (HashBytes(options_.restore_state.data(), options_.restore_state.size()) | 1)))
      return replace(
          "replacing a stale queue (all its processes are gone) to start from restore_state");
    if (keeper_->AllDone() && st.clients_joined >= h.num_clients)
      return replace("replacing a finished queue left behind by an earlier run");
    if (st.clients_joined > 0 && !keeper_->AllDone())
      Notice("queue '" + options_.name +
             "': resuming a stale queue (all its processes are gone): " + std::to_string(st.done) +
             " of " + std::to_string(st.total) + " items done");
    // Nobody else is here to disagree: the first process of the new job
    // sets the lease timeout, as a creator would, and the new job says
    // afresh whether the queue is kept (the old job's reasons are spent).
    if (options_.lease_timeout.count() != 0)
      h.lease_timeout_ms = static_cast<uint64_t>(options_.lease_timeout.count());
    segment_->counters().keep_reasons.store(0, std::memory_order_relaxed);
  } else {
    CompareConfig(*segment_, config_);
    const uint64_t mine = static_cast<uint64_t>(options_.lease_timeout.count());
    if (mine != 0 && mine != h.lease_timeout_ms)
      throw Error(ErrorKind::kConfigMismatch,
                  "queue '" + options_.name + "' exists with a different configuration: " +
                      "lease_timeout differs: " + std::to_string(mine) + " ms here, " +
                      (h.lease_timeout_ms == 0 ? std::string("0 (never)")
                                               : std::to_string(h.lease_timeout_ms) + " ms") +
                      " in segment. The lease timeout decides what processes do to each other's "
                      "items, so it is the queue's: pass the same value in every process, or 0 "
                      "to use the queue's");
    if (!options_.restore_state.empty() && !config_.fed &&
        h.restore_hash !=
            (HashBytes(options_.restore_state.data(), options_.restore_state.size()) | 1))
      throw Error(ErrorKind::kConfigMismatch,
                  "queue '" + options_.name + "' is already running from " +
                      (h.restore_hash == 0 ? std::string("a fresh start") : "another checkpoint") +
                      ", not from this restore_state; pass the same state in every process, or "
                      "wait for the running job to finish");
  }
  config_.seed = h.seed;  // after CompareConfig: with seed=None we adopt the creator's
  Register();
  if (options_.keep_unfinished)
    segment_->counters().keep_reasons.fetch_or(kKeepRequested, std::memory_order_relaxed);
  // Never trust a segment: a lease no client can finish would keep every
  // Take waiting at the end of the data.
  std::vector<std::string> repaired;
  if (keeper_->RepairLeases(slot_, /*admin_held=*/true, /*just_registered=*/true, &repaired) > 0) {
    std::string list;
    for (const std::string& r : repaired) list += (list.empty() ? "" : "; ") + r;
    Notice("queue '" + options_.name + "': segment " + segment_->path() +
           " was damaged; handed out again the items of " + std::to_string(repaired.size()) +
           " lease(s) no process could finish: " + list);
  }
  return true;
}

void WorkQueue::Impl::Register() {
  Geometry g = segment_->geometry();
  for (uint64_t s = 0; s < g.max_clients; ++s) {
    ClientEntry& cs = segment_->client(s);
    // acquire: pairs with the release stores of FREE in Close and
    // RecoverClient (housekeeper.cc): a slot seen FREE had its leases returned
    // or recovered. A filter only: locking the slot's life mutex decides.
    if (cs.state.load(std::memory_order_acquire) != kClientFree) continue;
    // A process with a stop timeout beats from its holder thread, which
    // runs whatever the process's own threads do, and stops only with it.
    const uint64_t stop_ns = static_cast<uint64_t>(options_.stop_timeout.count()) * 1000000ull;
    std::function<void()> beat;
    if (stop_ns > 0) {
      // relaxed: a time stamp; ReassignHung allows a whole stop_timeout.
      beat = [&cs] { cs.heartbeat_ns.store(MonotonicNs(), std::memory_order_relaxed); };
    }
    const auto period =
        std::chrono::nanoseconds(std::clamp<uint64_t>(stop_ns / 8, 10'000'000, 1'000'000'000));
    if (!holder_.Start(&cs.life, beat, period)) continue;
    uint64_t now = MonotonicNs();
    // relaxed, both: published by the release store of ACTIVE below.
    cs.stop_timeout_ns.store(stop_ns, std::memory_order_relaxed);
    cs.heartbeat_ns.store(now, std::memory_order_relaxed);
    for (auto* c : {&cs.items_taken, &cs.items_acked, &cs.items_given_back, &cs.items_recovered,
                    &cs.bytes_acked, &cs.records, &cs.stale_acks, &cs.idle_ns, &cs.left_ns})
      c->store(0, std::memory_order_relaxed);
    cs.pid.store(::getpid(), std::memory_order_relaxed);
    cs.joined_ns.store(now, std::memory_order_relaxed);
    cs.last_progress_ns.store(now, std::memory_order_relaxed);
    // release: pairs with the acquire loads of state in CheckClients,
    // LivePidsImpl, RepairLeases and Stats (housekeeper.cc): who sees the slot
    // ACTIVE sees the counters, pid and times stored above.
    cs.state.store(kClientActive, std::memory_order_release);
    segment_->counters().clients_joined.fetch_add(1, std::memory_order_relaxed);
    slot_ = s;
    leases_ = std::make_unique<ClientLeases>(
        table_.get(), &config_.paths, handle.path_token(), s,
        ClientLeases::Options{options_.split_tail, options_.min_split_bytes,
                              options_.split_multiple, record_bytes_});
    handle.Reset(table_->num_leases());
    return;
  }
  throw Error(ErrorKind::kInvalidArgument,
              "queue '" + options_.name + "': all " + std::to_string(g.max_clients) +
                  " client slots are in use; open it with a larger max_clients (in every process)");
}

StepStatus WorkQueue::Impl::AgreeStep(uint32_t rank, uint32_t ranks, uint64_t step, bool has_batch,
                                      std::chrono::steady_clock::time_point deadline) noexcept {
  if (closed_) return StepStatus::kInvalid;
  return detail::AgreeStep(*segment_, rank, ranks, step, has_batch, deadline, kWaitSliceNs);
}

void WorkQueue::Impl::Housekeep() noexcept {
  keeper_->CheckClients(slot_);
  keeper_->RepairLeases(slot_, /*admin_held=*/false);
  keeper_->ReleaseSettledAnchors();
  keeper_->ReassignHung(slot_, timeout_ns_);
  keeper_->TrySweep(slot_);
}

TakeStatus WorkQueue::Impl::Take(WorkItem* out, bool wait,
                                 std::chrono::steady_clock::time_point deadline) noexcept {
  if (closed_ || out == nullptr) return TakeStatus::kEnd;
  uint64_t now = CoarseNs();
  me().last_progress_ns.store(now, std::memory_order_relaxed);
  uint64_t next = next_housekeeping_ns_.load(std::memory_order_relaxed);
  if (now >= next && next_housekeeping_ns_.compare_exchange_strong(next, now + housekeeping_ns_))
    Housekeep();
  Counters& c = segment_->counters();
  uint64_t wait_start = 0;
  bool noticed = false;
  for (;;) {
    if (config_.fed && feed_->lost() != 0) return TakeStatus::kJobLost;  // see local_feed.h
    bool limit = false;
    if (leases_->TakeOnce(out, &limit)) break;
    if (limit) return TakeStatus::kLimit;
    if (config_.fed) {
      // Tell the host's feeder that takers ran dry: it claims more at once.
      // seq_cst: pairs with LocalFeed::DemandSeq, read before the feeder sleeps.
      c.feed_wanted.fetch_add(1, std::memory_order_seq_cst);
      FutexWake(c.feed_wanted, INT_MAX);
    }
    // Nothing to hand out: see whether anything can still come back.
    Housekeep();
    // Scan whatever orphan_seq says: a publisher that died between its CAS
    // and its bump left an orphan that only a scan finds.
    if (leases_->ClaimOrphan(out)) break;
    if (leases_->TrySplit(out)) break;
    if (keeper_->AllDone()) return TakeStatus::kEnd;
    if (!wait || std::chrono::steady_clock::now() >= deadline) return TakeStatus::kTimeout;
    uint64_t t0 = MonotonicNs();
    if (wait_start == 0) wait_start = t0;
    // seq_cst: read before announcing ourselves; pairs with WakeWaiters'
    // seq_cst bump (lease.cc): a wake after this load makes FUTEX_WAIT
    // return at once.
    uint32_t seq = c.wake_seq.load(std::memory_order_seq_cst);
    // seq_cst: pairs with WakeWaiters' seq_cst load of waiters (Dekker):
    // either it sees us waiting, or the re-check below sees its change.
    c.waiters.fetch_add(1, std::memory_order_seq_cst);
    // Re-check after announcing ourselves (pairs with WakeWaiters).
    // seq_cst, both: in the same total order as waiters; orphan_seq pairs
    // with MarkOrphan's bump, sweeps_pending with the increments in
    // RecoverLease, AllDone and ClaimOrphan.
    bool changed = leases_->OrphanSeqMoved() || keeper_->AllDone() ||
                   c.sweeps_pending.load(std::memory_order_seq_cst) > 0;
    if (!changed) {
      auto left = deadline - std::chrono::steady_clock::now();
      uint64_t slice = wait_slice_ns_;
      if (left < std::chrono::nanoseconds(slice))
        slice = left.count() > 0
                    ? static_cast<uint64_t>(
                          std::chrono::duration_cast<std::chrono::nanoseconds>(left).count())
                    : 0;
      FutexWait(c.wake_seq, seq, slice);
    }
    // seq_cst: as the increment; WakeWaiters skips the wake once it reads 0.
    c.waiters.fetch_sub(1, std::memory_order_seq_cst);
    uint64_t t1 = MonotonicNs();
    me().idle_ns.fetch_add(t1 - t0, std::memory_order_relaxed);
    me().last_progress_ns.store(t1, std::memory_order_relaxed);
    if (!noticed && t1 - wait_start > kWaitNoticeNs) {
      noticed = true;
      std::vector<int> pids = keeper_->LivePids(slot_);
      std::string list;
      for (int p : pids) list += (list.empty() ? "" : ", ") + std::to_string(p);
      if (feeder_)
        Notice("queue '" + options_.name + "': waiting " +
               std::to_string((t1 - wait_start) / 1000000000ull) +
               " s for more items from the coordinator: other hosts hold the rest, and what a "
               "host holds comes back once it stops renewing it (global_ttl)");
      else
        Notice("queue '" + options_.name + "': waiting " +
               std::to_string((t1 - wait_start) / 1000000000ull) +
               " s for items still held by other processes (pids " + list +
               "); they come back if those die. Set lease_timeout to reassign items of hung "
               "processes");
    }
  }
  return TakeStatus::kOk;
}

std::string WorkQueue::Impl::SaveState() const {
  // Across hosts the job's state is the tier's: cursor and done marks of
  // every host (items open anywhere are read again after a restore).
  if (feeder_) return feeder_->SaveState();
  return SaveHostState();
}

std::string WorkQueue::Impl::SaveHostState() const {
  if (closed_) throw Error(ErrorKind::kInvalidArgument, "queue '" + options_.name + "' is closed");
  SavedState s;
  s.fingerprint = DataFingerprint(config_);
  s.num_items = table_->num_items();
  s.num_epochs = config_.num_epochs;
  s.seed = config_.seed;
  ScanState(*table_, options_.name, &s);
  return SerializeState(s);
}

void WorkQueue::Impl::Close() noexcept {
  if (closed_ || handle.owner().forked()) return;  // the parent's to close
  closed_ = true;
  // The feeder first: it acks what this host finished and hands the feed to
  // another process of the host, while the segment is still mapped.
  if (feeder_) feeder_->Stop();
  Segment& seg = *segment_;
  leases_->ReturnAll();
  keeper_->CheckClients(slot_);
  bool died;
  RobustLock admin(&seg.header().admin_mutex);
  const auto admin_timeout = std::max(options_.attach_timeout, std::chrono::milliseconds(100));
  const int locked = admin.Lock(admin_timeout, &died);
  // release: pairs with the acquire loads of state in Register,
  // CheckClients, LivePidsImpl, RepairLeases and Stats (housekeeper.cc): who
  // sees the slot FREE sees our leases returned above.
  me().state.store(kClientFree, std::memory_order_release);
  me().left_ns.store(MonotonicNs(), std::memory_order_relaxed);
  holder_.Stop();
  CrashPoint("close.after_unregister");
  if (locked != 0) {
    // Whether we are the last one, and so whether to remove the segment, is
    // decided under the admin lock only: a process joining meanwhile would
    // find its queue unlinked under it. Leave the segment; our slot is free.
    Notice("queue '" + options_.name + "': closed without the segment's admin lock (" +
           (locked == ETIMEDOUT
                ? "a process held it for more than " + std::to_string(admin_timeout.count()) + " ms"
                : std::string("it is damaged: ") + std::strerror(locked)) +
           "), so segment " + segment_->path() +
           " was left in place; the next job with the same configuration resumes it, `tailcut rm " +
           options_.name + "` discards it");
    table_->WakeWaiters();
    return;
  }
  int active = 0;
  // acquire: pairs with the release stores of state in Register, Close and
  // RecoverClient; the admin mutex we hold orders them too.
  for (uint64_t s = 0; s < seg.geometry().max_clients; ++s)
    active += seg.client(s).state.load(std::memory_order_acquire) == kClientActive;
  if (active == 0) {
    bool done = keeper_->AllDone();
    uint64_t joined = seg.counters().clients_joined.load(std::memory_order_relaxed);
    if (done && joined >= seg.header().num_clients) {
      // Unlink first: killed in between, this leaves nothing under the
      // name (a process still holding the object finds a finished queue).
      seg.UnlinkIfSame();
      // release: pairs with the acquire load of state in AttachSegment
      // (segment.cc) of a process that opened the object before the unlink.
      seg.header().state.store(kRemoved, std::memory_order_release);
    } else if (!done) {
      QueueStats st = keeper_->Stats(options_.name);
      std::string kept = KeepReasonText(seg.counters().keep_reasons.load(std::memory_order_relaxed),
                                        joined, seg.header().num_clients);
      std::string progress =
          std::to_string(st.done) + " of " + std::to_string(st.total) + " items done";
      if (kept.empty()) {
        // Everyone left cleanly: nobody will come back for it, and queues
        // with per-run names would pile up in /dev/shm.
        seg.UnlinkIfSame();
        // release: as above.
        seg.header().state.store(kRemoved, std::memory_order_release);
        Notice("queue '" + options_.name + "' removed unfinished (" + progress +
               "): every process closed it; open it with keep_unfinished to resume it later");
      } else {
        Notice("queue '" + options_.name + "' left unfinished (" + progress + ") because " + kept +
               "; the next job with the same configuration resumes it, `tailcut rm " +
               options_.name + "` discards it");
      }
    }
  }
  admin.Unlock();
  table_->WakeWaiters();
}

WorkQueue::WorkQueue(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WorkQueue::~WorkQueue() {
  if (impl_->handle.owner().forked()) {
    // The parent's threads (life-mutex holder, feeder) do not exist here:
    // destroying their objects would join them. Unmap, leak the rest.
    impl_.release()->UnmapForked();
    return;
  }
  impl_->handle.CheckNoDependents(impl_->name());
}
WorkQueue::Dependent::Dependent(WorkQueue& queue) noexcept : queue_(queue) {
  queue_.impl_->handle.AddDependent(1);
}
WorkQueue::Dependent::~Dependent() { queue_.impl_->handle.AddDependent(-1); }

std::unique_ptr<WorkQueue> WorkQueue::Open(WorkQueueOptions options) {
  QueueConfig config = ResolveConfig(options);
  auto impl = std::make_unique<Impl>(std::move(options), std::move(config));
  impl->Open();
  return std::unique_ptr<WorkQueue>(new WorkQueue(std::move(impl)));
}

TakeStatus WorkQueue::Take(WorkItem* item,
                           std::chrono::steady_clock::time_point deadline) noexcept {
  TakeStatus s;
  if (impl_->handle.Refused(impl_->closed(), &s)) return s;
  return item ? impl_->Take(item, true, deadline) : TakeStatus::kInvalidArgument;
}
TakeStatus WorkQueue::TryTake(WorkItem* item) noexcept {
  TakeStatus s;
  if (impl_->handle.Refused(impl_->closed(), &s)) return s;
  return item ? impl_->Take(item, false, std::chrono::steady_clock::time_point::min())
              : TakeStatus::kInvalidArgument;
}
TakeStatus WorkQueue::TakeSplit(WorkItem* item, uint64_t below_epoch) noexcept {
  TakeStatus s;
  if (impl_->handle.Refused(impl_->closed(), &s)) return s;
  return item ? impl_->TakeSplit(item, below_epoch) : TakeStatus::kInvalidArgument;
}
ItemStatus WorkQueue::Ack(const WorkItem& item) noexcept {
  return impl_->ItemCall(item, true, [&] { return impl_->Ack(item); });
}
ItemStatus WorkQueue::GiveBack(const WorkItem& item) noexcept {
  return impl_->ItemCall(item, true, [&] { return impl_->GiveBack(item); });
}
ItemStatus WorkQueue::Progress(const WorkItem& item, uint64_t offset, uint64_t records) noexcept {
  return impl_->ItemCall(item, false, [&] { return impl_->Progress(item, offset, records); });
}
ItemStatus WorkQueue::Commit(const WorkItem& item, uint64_t offset) noexcept {
  return impl_->ItemCall(item, false, [&] { return impl_->Commit(item, offset); });
}
ItemStatus WorkQueue::Claim(const WorkItem& item, uint64_t up_to, uint64_t* end) noexcept {
  return impl_->ItemCall(item, false, [&] { return impl_->Claim(item, up_to, end); });
}
StepStatus WorkQueue::AgreeStep(uint32_t rank, uint32_t ranks, uint64_t step, bool has_batch,
                                std::chrono::steady_clock::time_point deadline) noexcept {
  StepStatus s;
  if (impl_->handle.Refused(impl_->closed(), &s)) return s;
  return impl_->AgreeStep(rank, ranks, step, has_batch, deadline);
}
std::string WorkQueue::SaveState() const {
  impl_->handle.owner().CheckNotForked("queue '" + impl_->name() + "'", "WorkQueue");
  return impl_->SaveState();
}
std::string WorkQueue::SaveHostState() const {
  impl_->handle.owner().CheckNotForked("queue '" + impl_->name() + "'", "WorkQueue");
  return impl_->SaveHostState();
}
std::string WorkQueue::SaveStateWithHosts(const std::vector<std::string>& host_states) const {
  impl_->handle.owner().CheckNotForked("queue '" + impl_->name() + "'", "WorkQueue");
  return impl_->SaveStateWithHosts(host_states);
}
std::string FedRestoreState(const std::string& tier_state, const std::string& host_state,
                            const std::string& token) {
  return SerializeFedRestore({token, tier_state, host_state});
}
QueueStats WorkQueue::Stats() const {
  impl_->handle.owner().CheckNotForked("queue '" + impl_->name() + "'", "WorkQueue");
  return impl_->Stats();
}
std::string WorkQueue::JobLossMessage() const { return impl_->JobLossMessage(); }
uint64_t WorkQueue::SettledTickets(uint64_t from) const noexcept {
  ItemStatus refused;
  if (impl_->handle.Refused(impl_->closed(), &refused)) return 0;  // a forked child's: unmapped
  return impl_->SettledTickets(from);
}
void WorkQueue::Close() noexcept { impl_->Close(); }
const std::string& WorkQueue::name() const noexcept { return impl_->name(); }
uint64_t WorkQueue::num_items() const noexcept { return impl_->config().items.size(); }
uint64_t WorkQueue::num_epochs() const noexcept { return impl_->config().num_epochs; }
uint64_t WorkQueue::seed() const noexcept { return impl_->config().seed; }
bool WorkQueue::shuffle() const noexcept { return impl_->config().shuffle; }
uint64_t WorkQueue::num_samples() const noexcept { return impl_->config().num_samples; }
const std::string& WorkQueue::format() const noexcept { return impl_->config().format; }
std::chrono::milliseconds WorkQueue::lease_timeout() const noexcept {
  return impl_->lease_timeout();
}
const std::vector<std::string>& WorkQueue::paths() const noexcept { return impl_->config().paths; }
const std::vector<FileIdentity>& WorkQueue::files() const noexcept {
  return impl_->config().identities;
}
const std::vector<WorkQueue::Item>& WorkQueue::items() const noexcept {
  return impl_->config().items;
}
uint64_t WorkQueue::ItemAt(uint64_t epoch, uint64_t position) const noexcept {
  return impl_->table().ItemAt(epoch, position);
}

}  // namespace tailcut
