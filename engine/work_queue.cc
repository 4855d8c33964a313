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

#include "engine/checkpoint.h"
#include "engine/clock.h"
#include "engine/config.h"
#include "engine/crash_point.h"
#include "engine/feeder.h"
#include "engine/futex.h"
#include "engine/handle_checks.h"
#include "engine/local_feed.h"
#include "engine/queue_core.h"
#include "engine/resume_point.h"
#include "engine/robust_mutex.h"
#include "engine/segment.h"
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
  AckStatus Ack(const WorkItem& item) noexcept;
  AckStatus GiveBack(const WorkItem& item) noexcept;
  AckStatus Progress(const WorkItem& item, uint64_t offset, uint64_t records) noexcept;
  AckStatus Commit(const WorkItem& item, uint64_t offset) noexcept;
  AckStatus Claim(const WorkItem& item, uint64_t up_to, uint64_t* end) noexcept;
  StepStatus AgreeStep(uint32_t rank, uint32_t ranks, uint64_t step, bool has_batch,
                       std::chrono::steady_clock::time_point deadline) noexcept;
  std::string SaveState() const;
  QueueStats Stats() const { return core_->Stats(options_.name); }
  std::string JobLossMessage() const { return closed_ || !feeder_ ? "" : feeder_->LossMessage(); }
  void Close() noexcept;

  const std::string& name() const { return options_.name; }
  std::chrono::milliseconds lease_timeout() const {
    return std::chrono::milliseconds(timeout_ns_ / 1000000);
  }
  const QueueConfig& config() const { return config_; }
  const QueueCore& core() const { return *core_; }
  bool closed() const { return closed_; }
  void UnmapForked() noexcept { segment_.reset(); }
  HandleChecks handle;  // fork, second acks, Dependents: the public calls use it
  // An item call behind the handle's checks (handle_checks.h).
  template <typename Call>
  AckStatus ItemCall(const WorkItem& item, bool finishes, Call call) noexcept {
    AckStatus s = handle.Check(item, closed_);
    return s != AckStatus::kOk ? s : handle.Explain(item, call(), finishes, timeout_ns_ > 0);
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
  void ApplyRestore(const SavedState& state);
  bool TakeOnce(WorkItem* out, bool* limit) noexcept;
  // A fed queue's next ticket below the cursor's limit, or kNoTicket.
  uint64_t NextFedTicket() noexcept;
  bool ClaimOrphan(WorkItem* out) noexcept;
  bool TrySplit(WorkItem* out) noexcept;
  // Bytes acked per busy nanosecond of a client, 0 if not known yet.
  double ClientRate(uint64_t slot) const noexcept;
  // Reserves a FREE lease of our region as TAKING. Returns false if none.
  bool ReserveLease(uint64_t* lease, uint64_t* taking_word) noexcept;
  void FillItem(WorkItem* out, uint64_t lease, uint64_t open_word, uint64_t ticket, uint64_t begin,
                uint64_t end, uint64_t index = kNoTicket) const noexcept;
  void Housekeep() noexcept;
  ClientSlot& me() const { return segment_->client(slot_); }

  WorkQueueOptions options_;
  QueueConfig config_;
  std::unique_ptr<Segment> segment_;
  std::unique_ptr<QueueCore> core_;
  LifeHolder holder_;
  SavedState restore_;
  uint64_t slot_ = kNoOwner;
  uint64_t lease_base_ = 0;
  uint64_t timeout_ns_ = 0;
  // How often a busy Take looks after others, and the longest sleep at the
  // end of the data: half a short lease timeout, so that it is acted on in
  // time, else kHousekeepingNs and kWaitSliceNs.
  uint64_t housekeeping_ns_ = kHousekeepingNs;
  uint64_t wait_slice_ns_ = kWaitSliceNs;
  std::atomic<uint64_t> next_housekeeping_ns_{0};
  std::atomic<uint64_t> orphan_scan_start_{0};
  // orphan_seq as read before this process's last scan that found no
  // orphan (none at first): every orphan published up to it was visible to
  // that scan, so the leases need scanning again only once it moves.
  std::atomic<uint64_t> no_orphans_at_seq_{~uint64_t{0}};
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
    options_.name += "." + ResolveHostId(options_);
    options_.restore_state.clear();  // the tier's state: the feeder restored it
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
      throw mismatch("works, file sizes, num_slices, shuffle or format differ");
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
        feed_ = std::make_unique<LocalFeed>(segment_.get(), core_.get());
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
  core_ = std::make_unique<QueueCore>(segment_.get(), config_.items, config_.num_epochs,
                                      config_.seed, config_.shuffle);
  if (restoring) {
    try {
      ApplyRestore(restore_);
    } catch (...) {
      segment_->UnlinkIfSame();
      throw;
    }
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
    uint64_t epoch = p.ticket / core_->num_items();
    const WorkQueue::Item& item =
        config_.items[core_->ItemAt(epoch, p.ticket % core_->num_items())];
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
    if (lease >= core_->num_leases())
      throw Error(ErrorKind::kInvalidArgument, "queue '" + options_.name + "': restore_state has " +
                                                   std::to_string(s.pieces.size()) +
                                                   " open items but this queue has room for " +
                                                   std::to_string(core_->num_leases()) +
                                                   "; raise max_clients or leases_per_client");
    uint64_t w = seg.lease(lease).word.load(std::memory_order_relaxed);
    core_->PublishOrphan(lease, w, p.ticket, p.begin, p.end, kLeasePreset);
    ++lease;
  }
  // release: pairs with the acquire loads of the cursor in AllDone, TrySweep,
  // Stats (queue_core.cc) and SaveState. Joiners see all of the above through
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
  core_ = std::make_unique<QueueCore>(segment_.get(), ReadItems(*segment_), h.num_epochs, h.seed,
                                      h.shuffle != 0);
  int live = core_->LiveClients(kNoOwner, /*admin_held=*/true);
  auto replace = [&](const std::string& why) {
    segment_->UnlinkIfSame();
    // release: pairs with the acquire load of state in AttachSegment
    // (segment.cc) of a process that opened the object before the unlink: it
    // sees REMOVED and starts over.
    h.state.store(kRemoved, std::memory_order_release);
    Notice("queue '" + options_.name + "': " + why);
    core_.reset();
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
    QueueStats st = core_->Stats(options_.name);
    // A queue started from this same state belongs to this job (its first
    // processes may have finished before we came): join it.
    if (!options_.restore_state.empty() &&
        h.restore_hash !=
            (HashBytes(options_.restore_state.data(), options_.restore_state.size()) | 1))
      return replace(
          "replacing a stale queue (all its processes are gone) to start from restore_state");
    if (core_->AllDone() && st.clients_joined >= h.num_clients)
      return replace("replacing a finished queue left behind by an earlier run");
    if (st.clients_joined > 0 && !core_->AllDone())
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
    if (!options_.restore_state.empty() &&
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
  if (core_->RepairLeases(slot_, /*admin_held=*/true, /*just_registered=*/true, &repaired) > 0) {
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
    ClientSlot& cs = segment_->client(s);
    // acquire: pairs with the release stores of FREE in Close and
    // RecoverClient (queue_core.cc): a slot seen FREE had its leases returned
    // or recovered. A filter only: locking the slot's life mutex decides.
    if (cs.state.load(std::memory_order_acquire) != kClientFree) continue;
    if (!holder_.Start(&cs.life)) continue;
    uint64_t now = MonotonicNs();
    for (auto* c : {&cs.items_taken, &cs.items_acked, &cs.items_given_back, &cs.items_recovered,
                    &cs.bytes_acked, &cs.records, &cs.stale_acks, &cs.idle_ns, &cs.left_ns})
      c->store(0, std::memory_order_relaxed);
    cs.pid.store(::getpid(), std::memory_order_relaxed);
    cs.joined_ns.store(now, std::memory_order_relaxed);
    cs.last_progress_ns.store(now, std::memory_order_relaxed);
    // release: pairs with the acquire loads of state in CheckClients,
    // LivePidsImpl, RepairLeases and Stats (queue_core.cc): who sees the slot
    // ACTIVE sees the counters, pid and times stored above.
    cs.state.store(kClientActive, std::memory_order_release);
    segment_->counters().clients_joined.fetch_add(1, std::memory_order_relaxed);
    slot_ = s;
    lease_base_ = s * g.leases_per_client;
    handle.Reset(core_->num_leases());
    return;
  }
  throw Error(ErrorKind::kInvalidArgument,
              "queue '" + options_.name + "': all " + std::to_string(g.max_clients) +
                  " client slots are in use; open it with a larger max_clients (in every process)");
}

void WorkQueue::Impl::FillItem(WorkItem* out, uint64_t lease, uint64_t open_word, uint64_t ticket,
                               uint64_t begin, uint64_t end, uint64_t index) const noexcept {
  uint64_t n = core_->num_items();
  out->ticket = ticket;
  out->epoch = ticket / n;
  out->index = index != kNoTicket ? index : core_->ItemAt(out->epoch, ticket % n);
  const WorkQueue::Item& item = config_.items[out->index];
  out->file = item.file;
  out->path = ItemPath::OfQueue(config_.paths[item.file], handle.path_token());
  out->begin = begin;
  out->end = end;
  out->lease = static_cast<uint32_t>(lease);
  out->generation = LeaseGenOf(open_word);
  out->piece = false;
}

bool WorkQueue::Impl::ClaimOrphan(WorkItem* out) noexcept {
  Counters& c = segment_->counters();
  uint64_t n = core_->num_leases();
  // seq_cst: pairs with MarkOrphan's seq_cst bump of orphan_seq after its
  // CAS (queue_core.cc): an orphan this scan misses was published after this
  // load, so its bump makes the next TakeOnce scan again.
  uint64_t seq_before = c.orphan_seq.load(std::memory_order_seq_cst);
  uint64_t start = orphan_scan_start_.fetch_add(1, std::memory_order_relaxed) % n;
  for (uint64_t k = 0; k < n; ++k) {
    uint64_t l = (start + k) % n;
    LeaseSlot& ls = segment_->lease(l);
    // acquire: pairs with MarkOrphan's CAS to ORPHAN (queue_core.cc); a
    // filter only, the CAS below decides.
    uint64_t w = ls.word.load(std::memory_order_acquire);
    if (LeaseStateOf(w) != kLeaseOrphan) continue;
    uint64_t open = NextLeaseWord(w, kLeaseOpen, slot_);
    // acq_rel: the acquire half pairs with MarkOrphan's CAS to ORPHAN
    // (ReturnToOrphan, PublishOrphan), so the fields read below are complete;
    // the release half publishes OPEN to the acquire loads of the word in
    // recoverers, TrySplit, SaveState and Stats.
    if (!ls.word.compare_exchange_strong(w, open, std::memory_order_acq_rel)) continue;
    uint64_t ticket = ls.ticket.load(std::memory_order_relaxed);
    uint64_t begin = ls.begin.load(std::memory_order_relaxed);
    uint64_t end = ls.end.load(std::memory_order_relaxed);
    uint32_t flags = ls.flags.load(std::memory_order_relaxed);
    // Where it resumes: its floor, as ReturnToOrphan or PublishOrphan
    // tagged it for the orphan word (a former owner's commits), else begin.
    // relaxed: as the fields above, acquired by our CAS of the word, which
    // MarkOrphan made after ReturnToOrphan's CAS of the floor.
    uint64_t from = begin;
    ProgressOffset(ls.floor.load(std::memory_order_relaxed), w, &from);
    if (begin <= end) {
      // Ours now: tag the extent (a former owner's late Claim, or a thief
      // that read it before, then fails its CAS), and not splittable until
      // we claim. An anchor whose tail was split off ends where the split
      // lowered it, as the extent says once no thief can lower it further.
      // What lies below the floor counts as claimed: no split takes it.
      // acquire: pairs with the extent CASes of TrySplit and of a former
      // owner's late Claim; the CAS below retries on them.
      uint64_t e = ls.extent.load(std::memory_order_acquire);
      Extent x = Extent::Of(e);
      const uint64_t unit = SplitUnit(end - begin);
      const uint64_t floor_units =
          from <= begin ? 0 : ExtentUnits(std::min(from, end) - begin, unit);
      for (;;) {
        Extent y = x;
        y.splittable = false;
        y.tag = GenTag(open, 8);
        y.claim = std::max(x.claim, std::min(floor_units, x.end));
        // acq_rel: pairs with TrySplit's split CAS and Claim's CAS on this
        // word: one that read the extent before our tag fails.
        if (ls.extent.compare_exchange_weak(e, y.Word(), std::memory_order_acq_rel)) {
          x = y;
          break;
        }
        x = Extent::Of(e);
      }
      end = std::min(end, begin + x.end * SplitUnit(end - begin));
    }
    // Never trust the segment: a piece must lie inside its ticket's item.
    bool valid = ticket < core_->total();
    if (valid) {
      const WorkQueue::Item& item =
          config_.items[core_->ItemAt(ticket / core_->num_items(), ticket % core_->num_items())];
      valid = begin <= end && begin >= item.begin && end <= item.end;
    }
    if (!valid) {
      // Drop the bad lease; if it stood for a real ticket, a sweep re-issues it.
      ls.ticket.store(kNoTicket, std::memory_order_relaxed);
      ls.flags.store(0, std::memory_order_relaxed);
      // acq_rel: the release half pairs with ReserveLease's acquire CAS: the
      // next owner sees ticket and flags cleared (I6).
      ls.word.compare_exchange_strong(open, NextLeaseWord(open, kLeaseFree, kNoOwner),
                                      std::memory_order_acq_rel);
      // acq_rel: pairs with the acquire loads of sweeps_pending in TrySweep
      // and AllDone (queue_core.cc): a sweep looks for the dropped ticket.
      c.sweeps_pending.fetch_add(1, std::memory_order_acq_rel);
      continue;
    }
    from = std::clamp(from, begin, end);
    // A fed queue's feeder dropped the ticket (its block went to another
    // host), or a former owner committed all of it: complete the lease as
    // an ack would, never hand it out.
    if (segment_->IsSkipped(ticket) || (from > begin && from == end)) {
      uint64_t acking = NextLeaseWord(open, kLeaseAcking, slot_);
      // acq_rel: as Ack's CAS to ACKING; FinishAck then frees the lease.
      if (ls.word.compare_exchange_strong(open, acking, std::memory_order_acq_rel))
        core_->FinishAck(l, acking);
      continue;
    }
    ls.progress.store(ProgressWord(from, open), std::memory_order_relaxed);
    ls.floor.store(ProgressWord(from, open), std::memory_order_relaxed);
    me().items_taken.fetch_add(1, std::memory_order_relaxed);
    me().items_recovered.fetch_add(1, std::memory_order_relaxed);
    FillItem(out, l, open, ticket, from, end);
    out->piece = flags & kLeasePiece;
    return true;
  }
  no_orphans_at_seq_.store(seq_before, std::memory_order_relaxed);
  return false;
}

bool WorkQueue::Impl::TakeOnce(WorkItem* out, bool* limit) noexcept {
  Counters& c = segment_->counters();
  // Orphans first, but scan for them only when one was published since
  // our last fruitless scan (the end of the data always scans: see Take).
  // seq_cst: pairs with MarkOrphan's seq_cst bump (queue_core.cc).
  if (c.orphan_seq.load(std::memory_order_seq_cst) !=
          no_orphans_at_seq_.load(std::memory_order_relaxed) &&
      ClaimOrphan(out))
    return true;
  SharedAtomic<uint64_t>& cursor = segment_->cursor().next_ticket;
  // total_tickets, or in a fed queue what its feeder granted so far.
  // acquire: pairs with LocalFeed::Grant's release store, so the skip bits
  // set below the new limit are seen by IsSkipped below.
  SharedAtomic<uint64_t>& granted = segment_->cursor().limit;
  const uint64_t total = core_->total();
  const bool fed = config_.fed;
  while (cursor.load(std::memory_order_relaxed) < granted.load(std::memory_order_acquire)) {
    // Reserve a lease of our region before taking a ticket, so that a death
    // right after fetch_add leaves a trace (I3).
    uint64_t l = 0, taking = 0;
    if (!ReserveLease(&l, &taking)) {
      *limit = true;
      return false;
    }
    LeaseSlot& ls = segment_->lease(l);
    CrashPoint("take.after_reserve");
    // acq_rel: the release half pairs with the acquire loads of the cursor
    // in TrySweep and AllDone (queue_core.cc): who sees the ticket taken sees
    // our TAKING lease (I3). A fed queue advances by CAS (NextFedTicket).
    uint64_t ticket = fed ? NextFedTicket() : cursor.fetch_add(1, std::memory_order_acq_rel);
    CrashPoint("take.after_fetch_add");
    // Nothing recorded yet (the ticket stays kNoTicket): freeing is the CAS.
    // acq_rel: the release half pairs with ReserveLease's acquire CAS.
    auto release = [&] {
      ls.word.compare_exchange_strong(taking, NextLeaseWord(taking, kLeaseFree, kNoOwner),
                                      std::memory_order_acq_rel);
    };
    if (ticket >= total) {
      release();
      break;
    }
    // Done before a restore, or (fed) another host's.
    if (segment_->IsDone(ticket) || segment_->IsSkipped(ticket)) {
      release();
      continue;
    }
    uint64_t n = core_->num_items();
    const uint64_t index = core_->ItemAt(ticket / n, ticket % n);
    const WorkQueue::Item& item = config_.items[index];
    const uint64_t open = NextLeaseWord(taking, kLeaseOpen, slot_);
    ls.begin.store(item.begin, std::memory_order_relaxed);
    ls.end.store(item.end, std::memory_order_relaxed);
    ls.progress.store(ProgressWord(item.begin, open), std::memory_order_relaxed);
    ls.floor.store(ProgressWord(item.begin, open), std::memory_order_relaxed);
    uint64_t length = item.end - item.begin;
    ls.extent.store(Extent::Fresh(ExtentUnits(length, SplitUnit(length)), open).Word(),
                    std::memory_order_relaxed);
    ls.flags.store(0, std::memory_order_relaxed);
    // The ticket last: a lease timeout may republish a TAKING lease once its
    // ticket shows (ReassignHung), and from then on we write nothing more.
    // release: pairs with the acquire loads of ticket in ReadTicketAndFlags,
    // RecoverLease and TrySweep (queue_core.cc): who sees it sees the fields.
    ls.ticket.store(ticket, std::memory_order_release);
    CrashPoint("take.after_ticket");
    // Fails only if a lease timeout reassigned the ticket while we were paused.
    // acq_rel: the release half publishes the fields to the acquire loads of
    // the word in recoverers, TrySplit, SaveState and Stats.
    if (!ls.word.compare_exchange_strong(taking, open, std::memory_order_acq_rel)) continue;
    me().items_taken.fetch_add(1, std::memory_order_relaxed);
    FillItem(out, l, open, ticket, item.begin, item.end, index);
    return true;
  }
  return false;
}

uint64_t WorkQueue::Impl::NextFedTicket() noexcept {
  // A fetch_add could pass the limit, and a ticket past it is not ours to
  // hand out yet: advance by CAS, and only below the limit.
  SharedAtomic<uint64_t>& cursor = segment_->cursor().next_ticket;
  // acquire (cursor and limit), seq_cst (CAS): as TakeOnce's fetch_add, whose release half
  // publishes the TAKING lease reserved before it to TrySweep and AllDone (I3); the limit's
  // acquire pairs with LocalFeed::Grant's release store.
  uint64_t ticket = cursor.load(std::memory_order_acquire);
  for (;;) {
    if (ticket >= segment_->cursor().limit.load(std::memory_order_acquire)) return kNoTicket;
    // seq_cst: see Segment::IsSkipped, which the caller checks next.
    if (cursor.compare_exchange_weak(ticket, ticket + 1, std::memory_order_seq_cst)) return ticket;
  }
}

bool WorkQueue::Impl::ReserveLease(uint64_t* lease, uint64_t* taking_word) noexcept {
  const uint64_t per_client = segment_->geometry().leases_per_client;
  for (uint64_t k = 0; k < per_client; ++k) {
    uint64_t l = lease_base_ + k;
    // acquire: a filter only; the CAS below decides.
    uint64_t w = segment_->lease(l).word.load(std::memory_order_acquire);
    if (LeaseStateOf(w) != kLeaseFree) continue;
    uint64_t taking = NextLeaseWord(w, kLeaseTaking, slot_);
    // acq_rel: the acquire half pairs with the release CAS that freed the
    // lease (FinishAck, SettleSplit, RecoverLease in queue_core.cc; TakeOnce,
    // ClaimOrphan, TrySplit), so its cleared ticket and flags are seen (I6);
    // the release half publishes TAKING to the acquire loads of the word in
    // TrySweep and the recoverers.
    if (segment_->lease(l).word.compare_exchange_strong(w, taking, std::memory_order_acq_rel)) {
      *lease = l;
      *taking_word = taking;
      return true;
    }
  }
  return false;
}

double WorkQueue::Impl::ClientRate(uint64_t slot) const noexcept {
  if (slot >= segment_->geometry().max_clients) return 0;
  const ClientSlot& cs = segment_->client(slot);
  uint64_t bytes = cs.bytes_acked.load(std::memory_order_relaxed);
  uint64_t joined = cs.joined_ns.load(std::memory_order_relaxed);
  uint64_t idle = cs.idle_ns.load(std::memory_order_relaxed);
  uint64_t now = CoarseNs();
  if (bytes == 0 || now <= joined + idle) return 0;
  return static_cast<double>(bytes) / static_cast<double>(now - joined - idle);
}

bool WorkQueue::Impl::TrySplit(WorkItem* out) noexcept {
  if (!options_.split_tail) return false;
  const uint64_t min_part = std::max<uint64_t>(options_.min_split_bytes, 1);
  for (int attempt = 0; attempt < 4; ++attempt) {
    // The open, splittable item with the most unclaimed bytes.
    uint64_t victim = kNoOwner, best = 0, victim_extent = 0, victim_ticket = 0, victim_begin = 0,
             victim_unit = 0, victim_end = 0;
    bool victim_piece = false;
    uint64_t victim_owner = kNoOwner;
    for (uint64_t l = 0; l < core_->num_leases(); ++l) {
      LeaseSlot& ls = segment_->lease(l);
      // acquire: pairs with the owner's CAS to OPEN (TakeOnce, ClaimOrphan,
      // TrySplit), so the fields read below were written before it.
      uint64_t w = ls.word.load(std::memory_order_acquire);
      if (LeaseStateOf(w) != kLeaseOpen || LeaseOwnerOf(w) == slot_) continue;
      uint32_t flags = ls.flags.load(std::memory_order_relaxed);
      if (flags & kLeasePreset) continue;
      // acquire: pairs with the owner's Claim CAS and other thieves' split
      // CASes on the extent; the split CAS below decides.
      uint64_t e = ls.extent.load(std::memory_order_acquire);
      Extent x = Extent::Of(e);
      if (!x.splittable || x.pending != 0) continue;
      uint64_t ticket = ls.ticket.load(std::memory_order_relaxed);
      uint64_t begin = ls.begin.load(std::memory_order_relaxed);
      uint64_t end = ls.end.load(std::memory_order_relaxed);
      // acquire: as the first load; an unchanged word says the lease did not
      // move on to another owner while its fields were read.
      if (ls.word.load(std::memory_order_acquire) != w || ticket >= core_->total() || begin > end)
        continue;
      uint64_t unit = SplitUnit(end - begin);
      uint64_t claimed = std::min(end, begin + x.claim * unit);
      uint64_t current_end = std::min(end, begin + x.end * unit);
      if (current_end <= claimed || current_end - claimed <= best) continue;
      best = current_end - claimed;
      victim = l;
      victim_extent = e;
      victim_ticket = ticket;
      victim_begin = begin;
      victim_unit = unit;
      victim_end = current_end;
      victim_piece = (flags & kLeasePiece) != 0;
      victim_owner = LeaseOwnerOf(w);
    }
    if (victim == kNoOwner || best < 2 * min_part) return false;
    // Split in the middle of what the owner has not claimed yet; an item the
    // owner has not started (it is only prefetched) goes almost whole: all
    // but its first unit, which the owner reads and acks. Not so a piece: a
    // thief starts its piece at once, and taking it whole would only pass it
    // from thief to thief.
    // Between the two, the owner keeps the share of the rest that matches its
    // speed against ours (bytes acked per busy second, from the counters in
    // the segment), so one split leaves it about as much as it can read while
    // we read ours; with no rate known yet, half.
    Extent x = Extent::Of(victim_extent);
    uint64_t end_units = ExtentUnits(victim_end - victim_begin, victim_unit);
    uint64_t rest = end_units - x.claim;
    uint64_t keep = rest / 2;
    double owner_rate = ClientRate(victim_owner), our_rate = ClientRate(slot_);
    if (owner_rate > 0 && our_rate > 0)
      keep =
          static_cast<uint64_t>(static_cast<double>(rest) * owner_rate / (owner_rate + our_rate));
    uint64_t split_units =
        x.claim == 0 && !victim_piece ? 1 : x.claim + std::max<uint64_t>(keep, 1);
    uint64_t split = victim_begin + split_units * victim_unit;
    if (split_units <= x.claim || split >= victim_end || victim_end - split < min_part)
      return false;
    // Our piece first, complete, in a lease of our own (I7).
    uint64_t mine, taking;
    if (!ReserveLease(&mine, &taking)) return false;
    LeaseSlot& ps = segment_->lease(mine);
    // Mark it a piece before it names a ticket: a recoverer must never take
    // it for an ordinary TAKING lease and re-issue the whole item.
    ps.anchor.store(static_cast<uint32_t>(victim), std::memory_order_relaxed);
    // seq_cst: pairs with the acquire loads of flags in ReadTicketAndFlags
    // (queue_core.h); the ticket's release below publishes it too.
    ps.flags.store(kLeasePiece, std::memory_order_seq_cst);
    // release: pairs with the acquire loads of ticket in ReadTicketAndFlags,
    // RecoverLease and TrySweep: who sees the ticket sees the piece flag and
    // the anchor.
    ps.ticket.store(victim_ticket, std::memory_order_release);
    const uint64_t open = NextLeaseWord(taking, kLeaseOpen, slot_);
    ps.begin.store(split, std::memory_order_relaxed);
    ps.end.store(victim_end, std::memory_order_relaxed);
    ps.progress.store(ProgressWord(split, open), std::memory_order_relaxed);
    ps.floor.store(ProgressWord(split, open), std::memory_order_relaxed);
    uint64_t length = victim_end - split;
    ps.extent.store(Extent::Fresh(ExtentUnits(length, SplitUnit(length)), open).Word(),
                    std::memory_order_relaxed);
    CrashPoint("split.after_reserve");
    Extent lowered = x;
    lowered.end = split_units;
    lowered.pending = mine + 1;
    lowered.split = true;
    // seq_cst: pairs with SaveState's seq_cst loads of split_seq before and
    // after its scan.
    segment_->counters().split_seq.fetch_add(1, std::memory_order_seq_cst);
    // acq_rel: pairs with the owner's Claim CAS and FinishAck's seal on the
    // same word: the owner either claimed past our split point first (we
    // fail) or sees the lower end. The release half publishes our piece's
    // fields to those that acquire the extent and find it pending
    // (SettleSplit, ReleaseSettledAnchors, RecoverLease, SaveState).
    if (!segment_->lease(victim).extent.compare_exchange_strong(victim_extent, lowered.Word(),
                                                                std::memory_order_acq_rel)) {
      ps.ticket.store(kNoTicket, std::memory_order_relaxed);
      // release, after the ticket: pairs with the second flags load of
      // ReadTicketAndFlags, which then sees the flags change and retries.
      ps.flags.store(0, std::memory_order_release);
      // acq_rel: the release half pairs with ReserveLease's acquire CAS: the
      // next owner sees ticket and flags cleared (I6).
      ps.word.compare_exchange_strong(taking, NextLeaseWord(taking, kLeaseFree, kNoOwner),
                                      std::memory_order_acq_rel);
      continue;
    }
    // Again after the CAS, still TAKING: a SaveState scan that saw neither
    // bump change had this lease TAKING all along (see SaveState).
    // seq_cst: as the first bump.
    segment_->counters().split_seq.fetch_add(1, std::memory_order_seq_cst);
    CrashPoint("split.after_cas");
    // acq_rel: the release half publishes the piece to the acquire loads of
    // the word in ReleaseSettledAnchors, recoverers, SaveState and Stats.
    ps.word.compare_exchange_strong(taking, open, std::memory_order_acq_rel);
    CrashPoint("split.after_open");
    core_->SettleSplit(victim, mine, slot_);
    segment_->counters().splits.fetch_add(1, std::memory_order_relaxed);
    me().splits.fetch_add(1, std::memory_order_relaxed);
    me().items_taken.fetch_add(1, std::memory_order_relaxed);
    FillItem(out, mine, open, victim_ticket, split, victim_end);
    out->piece = true;
    return true;
  }
  return false;
}

AckStatus WorkQueue::Impl::Claim(const WorkItem& item, uint64_t up_to, uint64_t* end) noexcept {
  if (closed_ || item.lease >= core_->num_leases()) return AckStatus::kInvalid;
  LeaseSlot& ls = segment_->lease(item.lease);
  const uint64_t ours = LeaseWord(kLeaseOpen, slot_, item.generation);
  // acquire: pairs with the CASes that may have moved the lease on
  // (ReturnToOrphan, ReassignHung in queue_core.cc); still ours, its fields
  // below are ours.
  if (ls.word.load(std::memory_order_acquire) != ours) return AckStatus::kStale;
  uint64_t begin = ls.begin.load(std::memory_order_relaxed);
  uint64_t limit = ls.end.load(std::memory_order_relaxed);
  if ((ls.flags.load(std::memory_order_relaxed) & kLeasePreset) || begin > limit) {
    *end = item.end;  // restored items are never split
    return AckStatus::kOk;
  }
  uint64_t unit = SplitUnit(limit - begin);
  uint64_t want = up_to <= begin ? 0 : ExtentUnits(std::min(up_to, limit) - begin, unit);
  // acquire: pairs with the extent CASes of TrySplit and ClaimOrphan.
  uint64_t e = ls.extent.load(std::memory_order_acquire);
  Extent x = Extent::Of(e);
  for (;;) {
    // Paused past a lease timeout, we may find the lease another owner's:
    // its extent then carries that owner's tag, and we touch nothing.
    if (x.tag != GenTag(ours, 8)) return AckStatus::kStale;
    Extent y = x;
    y.splittable = true;
    y.claim = std::max(x.claim, std::min(want, x.end));
    // acq_rel: pairs with TrySplit's split CAS on this word: a thief never
    // splits below what we claimed, nor we claim past its split.
    if (y.Word() == e || ls.extent.compare_exchange_weak(e, y.Word(), std::memory_order_acq_rel)) {
      x = y;
      break;
    }
    x = Extent::Of(e);
  }
  // The fields above may be another owner's if the lease moved on after
  // our first check; then the end would be theirs.
  // acquire: as the first check.
  if (ls.word.load(std::memory_order_acquire) != ours) return AckStatus::kStale;
  *end = std::min(limit, begin + x.end * unit);
  me().last_progress_ns.store(CoarseNs(), std::memory_order_relaxed);
  return AckStatus::kOk;
}

StepStatus WorkQueue::Impl::AgreeStep(uint32_t rank, uint32_t ranks, uint64_t step, bool has_batch,
                                      std::chrono::steady_clock::time_point deadline) noexcept {
  if (closed_) return StepStatus::kInvalid;
  return detail::AgreeStep(*segment_, rank, ranks, step, has_batch, deadline, kWaitSliceNs);
}

void WorkQueue::Impl::Housekeep() noexcept {
  core_->CheckClients(slot_);
  core_->RepairLeases(slot_, /*admin_held=*/false);
  core_->ReleaseSettledAnchors();
  if (timeout_ns_ > 0) core_->ReassignHung(slot_, timeout_ns_);
  core_->TrySweep(slot_);
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
    if (TakeOnce(out, &limit)) break;
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
    if (ClaimOrphan(out)) break;
    if (TrySplit(out)) break;
    if (core_->AllDone()) return TakeStatus::kEnd;
    if (!wait || std::chrono::steady_clock::now() >= deadline) return TakeStatus::kEmpty;
    uint64_t t0 = MonotonicNs();
    if (wait_start == 0) wait_start = t0;
    // seq_cst: read before announcing ourselves; pairs with WakeWaiters'
    // seq_cst bump (queue_core.cc): a wake after this load makes FUTEX_WAIT
    // return at once.
    uint32_t seq = c.wake_seq.load(std::memory_order_seq_cst);
    // seq_cst: pairs with WakeWaiters' seq_cst load of waiters (Dekker):
    // either it sees us waiting, or the re-check below sees its change.
    c.waiters.fetch_add(1, std::memory_order_seq_cst);
    // Re-check after announcing ourselves (pairs with WakeWaiters).
    // seq_cst, both: in the same total order as waiters; orphan_seq pairs
    // with MarkOrphan's bump, sweeps_pending with the increments in
    // RecoverLease, AllDone (queue_core.cc) and ClaimOrphan.
    bool changed = c.orphan_seq.load(std::memory_order_seq_cst) !=
                       no_orphans_at_seq_.load(std::memory_order_relaxed) ||
                   core_->AllDone() || c.sweeps_pending.load(std::memory_order_seq_cst) > 0;
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
      std::vector<int> pids = core_->LivePids(slot_);
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

AckStatus WorkQueue::Impl::Ack(const WorkItem& item) noexcept {
  if (closed_ || item.lease >= core_->num_leases()) return AckStatus::kInvalid;
  LeaseSlot& ls = segment_->lease(item.lease);
  uint64_t expected = LeaseWord(kLeaseOpen, slot_, item.generation);
  uint64_t acking = NextLeaseWord(expected, kLeaseAcking, slot_);
  // acq_rel: fails if a recoverer or ReassignHung moved the lease on (the
  // acquire half pairs with their CASes); the release half publishes ACKING
  // to a recoverer's acquire load, which finishes the ack should we die.
  if (!ls.word.compare_exchange_strong(expected, acking, std::memory_order_acq_rel)) {
    me().stale_acks.fetch_add(1, std::memory_order_relaxed);
    segment_->counters().stale_acks.fetch_add(1, std::memory_order_relaxed);
    return AckStatus::kStale;
  }
  CrashPoint("ack.after_mark");
  core_->FinishAck(item.lease, acking);
  ClientSlot& cs = me();
  cs.items_acked.fetch_add(1, std::memory_order_relaxed);
  cs.bytes_acked.fetch_add(item.end - item.begin, std::memory_order_relaxed);
  cs.last_progress_ns.store(CoarseNs(), std::memory_order_relaxed);
  core_->WakeWaiters();
  return AckStatus::kOk;
}

AckStatus WorkQueue::Impl::GiveBack(const WorkItem& item) noexcept {
  if (closed_ || item.lease >= core_->num_leases()) return AckStatus::kInvalid;
  LeaseSlot& ls = segment_->lease(item.lease);
  uint64_t expected = LeaseWord(kLeaseOpen, slot_, item.generation);
  // acquire: pairs with the CASes that may have moved the lease on
  // (ReturnToOrphan, ReassignHung); ReturnToOrphan's CAS below decides.
  if (ls.word.load(std::memory_order_acquire) != expected) return AckStatus::kStale;
  CrashPoint("giveback.after_mark");
  if (!core_->ReturnToOrphan(ls, &expected)) return AckStatus::kStale;
  me().items_given_back.fetch_add(1, std::memory_order_relaxed);
  core_->WakeWaiters();
  return AckStatus::kOk;
}

AckStatus WorkQueue::Impl::Commit(const WorkItem& item, uint64_t offset) noexcept {
  if (closed_ || item.lease >= core_->num_leases()) return AckStatus::kInvalid;
  const uint64_t ours = LeaseWord(kLeaseOpen, slot_, item.generation);
  AckStatus s = RecordCommit(segment_->lease(item.lease), ours, offset, record_bytes_);
  if (s == AckStatus::kOk) me().last_progress_ns.store(CoarseNs(), std::memory_order_relaxed);
  return s;
}

AckStatus WorkQueue::Impl::Progress(const WorkItem& item, uint64_t offset,
                                    uint64_t records) noexcept {
  if (closed_ || item.lease >= core_->num_leases()) return AckStatus::kInvalid;
  const uint64_t ours = LeaseWord(kLeaseOpen, slot_, item.generation);
  AckStatus s = RecordProgress(segment_->lease(item.lease), ours, offset, record_bytes_);
  if (s != AckStatus::kOk) return s;
  if (records != 0) me().records.fetch_add(records, std::memory_order_relaxed);
  me().last_progress_ns.store(CoarseNs(), std::memory_order_relaxed);
  return AckStatus::kOk;
}

std::string WorkQueue::Impl::SaveState() const {
  // Across hosts the job's state is the tier's: cursor and done marks of
  // every host (items open anywhere are read again after a restore).
  if (feeder_) return feeder_->SaveState();
  if (closed_) throw Error(ErrorKind::kInvalidArgument, "queue '" + options_.name + "' is closed");
  SavedState s;
  s.fingerprint = DataFingerprint(config_);
  s.num_items = core_->num_items();
  s.num_epochs = config_.num_epochs;
  s.seed = config_.seed;
  ScanState(*core_, options_.name, &s);
  return SerializeState(s);
}

void WorkQueue::Impl::Close() noexcept {
  if (closed_ || handle.owner().forked()) return;  // the parent's to close
  closed_ = true;
  // The feeder first: it acks what this host finished and hands the feed to
  // another process of the host, while the segment is still mapped.
  if (feeder_) feeder_->Stop();
  Segment& seg = *segment_;
  for (uint64_t l = 0; l < core_->num_leases(); ++l) {
    LeaseSlot& ls = seg.lease(l);
    // acquire: pairs with the CASes that may have moved our leases on
    // (ReassignHung, recoverers); ReturnToOrphan's CAS decides.
    uint64_t w = ls.word.load(std::memory_order_acquire);
    if (LeaseStateOf(w) != kLeaseOpen || LeaseOwnerOf(w) != slot_) continue;
    if (core_->ReturnToOrphan(ls, &w)) {
      me().items_given_back.fetch_add(1, std::memory_order_relaxed);
    }
  }
  core_->CheckClients(slot_);
  bool died;
  RobustLock admin(&seg.header().admin_mutex);
  const auto admin_timeout = std::max(options_.attach_timeout, std::chrono::milliseconds(100));
  const int locked = admin.Lock(admin_timeout, &died);
  // release: pairs with the acquire loads of state in Register,
  // CheckClients, LivePidsImpl, RepairLeases and Stats (queue_core.cc): who
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
    core_->WakeWaiters();
    return;
  }
  int active = 0;
  // acquire: pairs with the release stores of state in Register, Close and
  // RecoverClient; the admin mutex we hold orders them too.
  for (uint64_t s = 0; s < seg.geometry().max_clients; ++s)
    active += seg.client(s).state.load(std::memory_order_acquire) == kClientActive;
  if (active == 0) {
    bool done = core_->AllDone();
    uint64_t joined = seg.counters().clients_joined.load(std::memory_order_relaxed);
    if (done && joined >= seg.header().num_clients) {
      // Unlink first: killed in between, this leaves nothing under the
      // name (a process still holding the object finds a finished queue).
      seg.UnlinkIfSame();
      // release: pairs with the acquire load of state in AttachSegment
      // (segment.cc) of a process that opened the object before the unlink.
      seg.header().state.store(kRemoved, std::memory_order_release);
    } else if (!done) {
      QueueStats st = core_->Stats(options_.name);
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
  core_->WakeWaiters();
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
AckStatus WorkQueue::Ack(const WorkItem& item) noexcept {
  return impl_->ItemCall(item, true, [&] { return impl_->Ack(item); });
}
AckStatus WorkQueue::GiveBack(const WorkItem& item) noexcept {
  return impl_->ItemCall(item, true, [&] { return impl_->GiveBack(item); });
}
AckStatus WorkQueue::Progress(const WorkItem& item, uint64_t offset, uint64_t records) noexcept {
  return impl_->ItemCall(item, false, [&] { return impl_->Progress(item, offset, records); });
}
AckStatus WorkQueue::Commit(const WorkItem& item, uint64_t offset) noexcept {
  return impl_->ItemCall(item, false, [&] { return impl_->Commit(item, offset); });
}
AckStatus WorkQueue::Claim(const WorkItem& item, uint64_t up_to, uint64_t* end) noexcept {
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
QueueStats WorkQueue::Stats() const {
  impl_->handle.owner().CheckNotForked("queue '" + impl_->name() + "'", "WorkQueue");
  return impl_->Stats();
}
std::string WorkQueue::JobLossMessage() const { return impl_->JobLossMessage(); }
void WorkQueue::Close() noexcept { impl_->Close(); }
const std::string& WorkQueue::name() const noexcept { return impl_->name(); }
uint64_t WorkQueue::num_items() const noexcept { return impl_->config().items.size(); }
uint64_t WorkQueue::num_epochs() const noexcept { return impl_->config().num_epochs; }
uint64_t WorkQueue::seed() const noexcept { return impl_->config().seed; }
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
  return impl_->core().ItemAt(epoch, position);
}

}  // namespace tailcut
