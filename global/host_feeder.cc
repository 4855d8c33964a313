// The host's feeder: the Feeder that WorkQueue::Open loads from this library
// when a coordinator is set (engine/feeder.h). Every process of a host runs
// one thread of it; the one that leads (LocalFeed::TryLead) claims blocks of
// tickets from the tier, grants them to the host's queue, acks the tickets
// the host finished, and drops a block the tier gave to another host
// meanwhile; a heartbeat thread beside it renews the blocks, so that neither
// trainers in a long transform nor a slow round of the feeder thread (a
// notice waiting for Python's GIL, a block dropped) lets them expire. When
// the tier answers that the job is lost, it records that in the host's queue
// (LocalFeed::Lose), where every process's Take sees it, and calls the tier
// no more. See docs/global.md, "One queue per host, fed by the tier", "The
// timings" and "Losing the job's state".
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/feeder.h"
#include "engine/local_feed.h"
#include "tailcut/global_tier.h"

namespace tailcut::detail {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How often the leader looks for finished tickets, and how often a follower
// tries to lead.
constexpr milliseconds kFeedPeriod{20};
constexpr milliseconds kFollowPeriod{100};
// How soon a leader asks again after the tier said kWait.
constexpr milliseconds kWaitPeriod{50};
// The heartbeat renews the host's blocks this many times per global_ttl: a
// host paused (SIGSTOP, a long GC, a loaded machine) for up to 7/8 of the
// TTL keeps them, and a renewal lost to a Redis hiccup is tried again long
// before the deadline.
constexpr int kRenewalsPerTtl = 8;
// A leader with work enough, which claims nothing, looks for expired blocks
// (a dead host's) this many times per global_ttl; every Claim looks for them
// first anyway. So a dead host's work comes back at most ttl * (1 + 1/16)
// after its last renewal, not whenever the others next run short.
constexpr int kExpiryChecksPerTtl = 16;

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The run in the host's queue (LocalFeed::BindRun): never 0.
uint64_t RunHash(const std::string& run_id) {
  return static_cast<uint64_t>(std::hash<std::string>{}(run_id)) | 1;
}

class HostFeeder final : public Feeder {
 public:
  HostFeeder(const WorkQueueOptions& options, const FeedJob& job)
      : ttl_(options.global_ttl),
        renew_period_(std::max<milliseconds>(ttl_ / kRenewalsPerTtl, milliseconds(1))),
        expiry_check_period_(std::max<milliseconds>(ttl_ / kExpiryChecksPerTtl, milliseconds(1))),
        on_notice_(options.on_notice) {
    GlobalTierOptions o;
    o.coordinator = options.coordinator;
    o.host_id = ResolveHostId(options);
    o.job.name = job.name;
    o.job.num_items = job.num_items;
    o.job.num_epochs = job.num_epochs;
    o.job.block_size = options.global_block_size != 0
                           ? options.global_block_size
                           : std::clamp<uint64_t>(job.num_items / 64, 1, 64);
    o.job.seed = job.seed;
    o.job.seed_explicit = job.seed_explicit;
    o.job.files_fingerprint = Hex(job.fingerprint);
    if (!job.seed_explicit) {
      // A proposal, used only if this host creates the job.
      o.job.seed = static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^
                   (uint64_t{std::random_device{}()} << 32);
    }
    if (options.restore_state.rfind("tailcut-global-state", 0) == 0) {
      o.restore_state = options.restore_state;
    } else if (IsFedRestore(options.restore_state)) {
      FedRestore restore = DeserializeFedRestore(job.name, options.restore_state);
      o.restore_state = std::move(restore.tier);
      o.restore_token = std::move(restore.token);
    } else if (!options.restore_state.empty()) {
      throw Error(ErrorKind::kInvalidArgument,
                  "queue '" + job.name +
                      "': restore_state is a state of a queue on one host, but this queue "
                      "spans hosts (a coordinator is set): restore from a state saved with the "
                      "same coordinator, or unset the coordinator");
    }
    if (options.on_notice) o.on_notice = options.on_notice;
    // Reconnecting through a Redis restart must end well before a block's
    // deadline passes unrenewed.
    o.retry_for = std::min<milliseconds>(o.retry_for, ttl_ / 3);
    tier_ = GlobalTier::Open(std::move(o));
  }

  ~HostFeeder() override { Stop(); }

  uint64_t seed() const override { return tier_->job().seed; }

  void Start(LocalFeed* feed) override {
    feed_ = feed;
    if (!feed_->BindRun(RunHash(tier_->run_id())))
      throw Error(ErrorKind::kConfigMismatch,
                  "queue '" + tier_->job().name + "." + tier_->host_id() +
                      "' was fed by another run of job '" + tier_->job().name + "' on " +
                      tier_->coordinator() +
                      " (the job was created again since): its done items are not this run's. "
                      "Stop the processes of the run before; once none is left, open the queue "
                      "again and it starts afresh");
    thread_ = std::thread([this] { Run(); });
  }

  void Stop() noexcept override {
    {
      std::lock_guard lock(mu_);
      if (stop_) return;
      stop_ = true;
    }
    wake_.notify_all();
    if (feed_ != nullptr) feed_->WakeFeeder();
    if (thread_.joinable()) thread_.join();
    // Started by the feeder thread (TakeOver), joined once that one is.
    if (heartbeat_.joinable()) heartbeat_.join();
  }

  std::string SaveState() override { return tier_->SaveState(); }

  std::string SaveStateWithHosts(const std::vector<std::string>& host_states) override {
    return GlobalStateWithHosts(tier_->SaveState(), host_states);
  }

  std::string LossMessage() const override {
    uint32_t reason = feed_ == nullptr ? 0 : feed_->lost();
    if (reason == 0) return "";
    // Never trust the segment: an unknown reason is worded as the whole job gone.
    GlobalLoss loss = reason <= static_cast<uint32_t>(GlobalLoss::kOpenBlocks)
                          ? static_cast<GlobalLoss>(reason)
                          : GlobalLoss::kGone;
    return GlobalLossMessage(loss, tier_->job().name, tier_->coordinator());
  }

 private:
  struct Held {
    GlobalBlock block;  // tickets: those this host must finish
    std::set<uint64_t> acked;
  };

  void Notice(const std::string& line) const {
    try {
      if (on_notice_)
        on_notice_(line);
      else
        std::fprintf(stderr, "tailcut: %s\n", line.c_str());
    } catch (...) {
    }
  }

  // Sleeps until `until` or Stop. Returns false once stopped.
  bool SleepUntil(Clock::time_point until) {
    std::unique_lock lock(mu_);
    wake_.wait_until(lock, until, [this] { return stop_; });
    return !stop_;
  }

  void Run() noexcept {
    bool leading = false;
    for (;;) {
      if (!leading) {
        LocalFeed::Lead lead = feed_->TryLead();
        if (lead != LocalFeed::Lead::kFollowing) {
          leading = true;
          TakeOver(lead == LocalFeed::Lead::kTookOver);
        } else if (!SleepUntil(Clock::now() + kFollowPeriod)) {
          return;
        }
        continue;
      }
      if (lost_) {
        // Nothing more to do with the tier: wait to resign at Stop.
        if (SleepUntil(Clock::now() + kFollowPeriod)) continue;
        feed_->Resign();
        return;
      }
      feed_->WaitForDemand(demand_seq_, kFeedPeriod.count() * 1000000ull);
      demand_seq_ = feed_->DemandSeq();
      bool stopping;
      {
        std::lock_guard lock(mu_);
        stopping = stop_;
      }
      try {
        Feed(stopping);
        failing_since_ = Clock::time_point{};
      } catch (const Error& e) {
        // Redis unreachable past retry_for: not a loss (the job's keys may
        // all be there once it answers). Keep the blocks and try again; the
        // deadline in the tier decides whether they stay ours.
        if (failing_since_ == Clock::time_point{}) {
          failing_since_ = Clock::now();
          Notice(std::string(e.what()) + "; the feeder of host " + tier_->host_id() +
                 " keeps trying: its processes finish what they hold, then wait");
        }
      }
      Publish(false);
      if (stopping) {
        feed_->Resign();
        return;
      }
    }
  }

  // Continues from the blocks the segment records (a dead or departed
  // feeder's): renew them now, their tickets are the ones not skipped.
  void TakeOver(bool after_death) {
    std::vector<std::vector<uint64_t>> tickets;
    std::vector<FedBlockInfo> blocks = feed_->Blocks(&tickets);
    held_.clear();
    for (size_t i = 0; i < blocks.size(); ++i) {
      Held h;
      h.block.first = blocks[i].first;
      h.block.last = blocks[i].last;
      h.block.generation = blocks[i].generation;
      h.block.tickets = std::move(tickets[i]);
      held_.push_back(std::move(h));
    }
    next_claim_ = Clock::now();
    next_expiry_check_ = Clock::now();
    demand_seq_ = feed_->DemandSeq();
    lost_ = feed_->lost() != 0;  // a feeder before us learnt it: no need to ask again
    // Renew at once: the blocks of a feeder that died may be close to their
    // deadlines.
    Publish(true);
    if (!heartbeat_.joinable()) heartbeat_ = std::thread([this] { Beat(); });
    if (after_death && !blocks.empty())
      Notice("queue '" + tier_->job().name + "': took over feeding host " + tier_->host_id() +
             " with " + std::to_string(blocks.size()) + " blocks from a feeder that died");
  }

  void Drop(Held& h, const char* why) {
    FedBlockInfo info{h.block.first, h.block.last, h.block.generation};
    int taken = feed_->Drop(info, h.block.tickets);
    Notice("queue '" + tier_->job().name + "': block [" + std::to_string(h.block.first) + ", " +
           std::to_string(h.block.last) + ") of host " + tier_->host_id() + " " + why +
           ": its unfinished tickets went to another host (" + std::to_string(taken) +
           " items taken back here; their acks are refused)");
  }

  // The tier answered kLost: every process of the host learns it from the
  // queue; this one says it once.
  void Lose() {
    lost_ = true;
    feed_->Lose(static_cast<uint32_t>(tier_->loss()));
    std::string message = LossMessage();  // "" if the job had ended here first
    if (!message.empty()) Notice(message);
  }

  // The heartbeat's view of the blocks this host holds: what held_ holds
  // now (none once the job is lost). renew_now: renew them at once.
  void Publish(bool renew_now) {
    std::vector<GlobalBlock> leases;
    if (!lost_) {
      for (const Held& h : held_) {
        GlobalBlock lease;  // no tickets: Renew names a block by first and generation
        lease.first = h.block.first;
        lease.last = h.block.last;
        lease.generation = h.block.generation;
        leases.push_back(std::move(lease));
      }
    }
    {
      std::lock_guard lock(mu_);
      leases_ = std::move(leases);
      beat_now_ = beat_now_ || renew_now;
    }
    if (renew_now) wake_.notify_all();
  }

  // The heartbeat thread: renews the blocks the leader holds every
  // renew_period_, whatever the feeder thread and the host's processes are
  // doing. What it finds but cannot act on (a block the tier gave to another
  // host, the job lost) it leaves to the feeder thread and wakes it.
  void Beat() noexcept {
    Clock::time_point next = Clock::now();
    for (;;) {
      std::vector<GlobalBlock> leases;
      {
        std::unique_lock lock(mu_);
        wake_.wait_until(lock, next, [this] { return stop_ || beat_now_; });
        if (stop_) return;
        beat_now_ = false;
        leases = leases_;
      }
      // Paced from the start of a round: a slow round does not stretch the
      // time between two renewals of a block.
      next = Clock::now() + renew_period_;
      bool wake_feeder = false;
      for (const GlobalBlock& b : leases) {
        GlobalAckStatus st;
        try {
          st = tier_->Renew(b, ttl_);
        } catch (...) {
          break;  // Redis unreachable past retry_for: the feeder thread says so; next round
        }
        if (st == GlobalAckStatus::kLost) {  // sticky in tier_: the feeder thread sees it
          wake_feeder = true;
          break;
        }
        if (st == GlobalAckStatus::kStale) {
          std::lock_guard lock(mu_);
          stale_.push_back({b.first, b.generation});
          wake_feeder = true;
        }
      }
      if (wake_feeder) feed_->WakeFeeder();
    }
  }

  // Drops the blocks whose renewal the tier refused (re-owned by another
  // host while this one was paused past their deadline).
  void DropStale() {
    std::vector<std::pair<uint64_t, uint64_t>> stale;
    {
      std::lock_guard lock(mu_);
      stale.swap(stale_);
    }
    for (const auto& [first, generation] : stale) {
      for (auto it = held_.begin(); it != held_.end(); ++it) {
        if (it->block.first == first && it->block.generation == generation) {
          Drop(*it, "was taken over by another host after its deadline passed");
          held_.erase(it);
          break;
        }
      }
    }
  }

  // Makes a block the tier granted this host's. False if the host's queue
  // cannot hold it (said once; it expires unrenewed and goes to another host).
  bool Hold(GlobalBlock block) {
    FedBlockInfo info{block.first, block.last, block.generation};
    if (!feed_->Grant(info, block.tickets)) {
      // Out of this queue's range: the tier's keys do not match it.
      Notice("queue '" + tier_->job().name + "': the coordinator handed out block [" +
             std::to_string(block.first) + ", " + std::to_string(block.last) +
             ") that this host's queue cannot hold; left to expire");
      next_claim_ = Clock::now() + milliseconds(1000);
      return false;
    }
    Held h;
    h.block = std::move(block);
    held_.push_back(std::move(h));
    return true;
  }

  void Feed(bool stopping) {
    // The heartbeat's renewals found the job lost, or blocks taken over.
    if (tier_->loss() != GlobalLoss::kNone) return Lose();
    DropStale();

    // Acks: tickets finished here since the last round.
    for (auto it = held_.begin(); it != held_.end();) {
      Held& h = *it;
      std::vector<uint64_t> fresh;
      for (uint64_t t : feed_->Finished(h.block.tickets))
        if (!h.acked.count(t)) fresh.push_back(t);
      if (!fresh.empty()) {
        GlobalAckStatus st = tier_->Ack(h.block, fresh);
        if (st == GlobalAckStatus::kLost) return Lose();
        if (st == GlobalAckStatus::kStale) {
          Drop(h, "was taken over by another host after its deadline passed");
          it = held_.erase(it);
          continue;
        }
        h.acked.insert(fresh.begin(), fresh.end());
      }
      if (h.acked.size() == h.block.tickets.size()) {
        feed_->Forget(h.block.first);
        it = held_.erase(it);
        continue;
      }
      ++it;
    }
    if (stopping || feed_->ended()) return;

    // Claims: keep two blocks of untaken tickets ahead of the takers (a
    // taker that runs dry wakes us at once, see WaitForDemand). Every Claim
    // re-owns an expired block before it takes a new one.
    Clock::time_point now = Clock::now();
    uint64_t untaken = 0;
    for (const Held& h : held_) untaken += feed_->Untaken(h.block.tickets);
    while (now >= next_claim_ && untaken < 2 * tier_->job().block_size &&
           held_.size() + 1 < kFedBlocks) {
      GlobalBlock block;
      milliseconds retry{0};
      next_expiry_check_ = Clock::now() + expiry_check_period_;
      GlobalClaimStatus st = tier_->Claim(ttl_, &block, &retry);
      if (st == GlobalClaimStatus::kLost) return Lose();
      if (st == GlobalClaimStatus::kEnd) {
        feed_->End();
        return;
      }
      if (st == GlobalClaimStatus::kWait) {
        // Nothing new: only a block that expires comes back, or the end.
        // The rest is other hosts': the epochs this host finished are over
        // here (a pool's loaders end them without waiting for the others).
        feed_->Drained();
        // Ask again soon, so that the end is seen without delay.
        next_claim_ = Clock::now() + std::clamp<milliseconds>(retry, kFeedPeriod, kWaitPeriod);
        return;
      }
      uint64_t more = feed_->Untaken(block.tickets);
      if (!Hold(std::move(block))) return;
      untaken += more;
    }

    // Work enough, so no Claim for a while: look for a dead host's blocks
    // all the same, so its work does not wait until this host runs short.
    if (now >= next_expiry_check_ && held_.size() + 1 < kFedBlocks) {
      next_expiry_check_ = now + expiry_check_period_;
      GlobalBlock block;
      GlobalClaimStatus st = tier_->ClaimExpired(ttl_, &block);
      if (st == GlobalClaimStatus::kLost) return Lose();
      if (st == GlobalClaimStatus::kOk) Hold(std::move(block));
    }
  }

  const milliseconds ttl_;
  const milliseconds renew_period_;         // the heartbeat's
  const milliseconds expiry_check_period_;  // ClaimExpired's, without a Claim meanwhile
  std::function<void(const std::string&)> on_notice_;
  std::unique_ptr<GlobalTier> tier_;
  LocalFeed* feed_ = nullptr;
  std::thread thread_;     // the feeder thread: Run
  std::thread heartbeat_;  // Beat, from the first TakeOver on
  std::mutex mu_;          // guards what follows, to the leader's view
  std::condition_variable wake_;
  bool stop_ = false;
  std::vector<GlobalBlock> leases_;  // the blocks to renew (Publish), without tickets
  bool beat_now_ = false;            // renew them now (a takeover)
  std::vector<std::pair<uint64_t, uint64_t>> stale_;  // (first, generation) refused renewals
  // The leader's view (the feeder thread's alone).
  std::vector<Held> held_;
  Clock::time_point next_claim_, next_expiry_check_, failing_since_;
  uint32_t demand_seq_ = 0;
  bool lost_ = false;  // the tier lost the job: no more calls to it
};

}  // namespace

}  // namespace tailcut::detail

// The factory engine/feeder.cc looks up with dlsym.
extern "C" TAILCUT_EXPORT tailcut::detail::Feeder* tailcut_open_feeder_v1(
    const tailcut::WorkQueueOptions& options, const tailcut::detail::FeedJob& job) {
  return new tailcut::detail::HostFeeder(options, job);
}
