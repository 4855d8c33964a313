// The host's feeder: the Feeder that WorkQueue::Open loads from this library
// when a coordinator is set (engine/feeder.h). Every process of a host runs
// one thread of it; the one that leads (LocalFeed::TryLead) claims blocks of
// tickets from the tier, grants them to the host's queue, renews them, acks
// the tickets the host finished, and drops a block the tier gave to another
// host meanwhile. When the tier answers that the job is lost, it records that
// in the host's queue (LocalFeed::Lose), where every process's Take sees it,
// and calls the tier no more. See docs/global.md, "One queue per host, fed by
// the tier" and "Losing the job's state".
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
      : ttl_(options.global_ttl), on_notice_(options.on_notice) {
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
    next_renew_ = Clock::now();
    next_claim_ = Clock::now();
    demand_seq_ = feed_->DemandSeq();
    lost_ = feed_->lost() != 0;  // a feeder before us learnt it: no need to ask again
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

  void Feed(bool stopping) {
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
    if (stopping) return;

    // Renewals, every third of the TTL.
    Clock::time_point now = Clock::now();
    if (now >= next_renew_) {
      for (auto it = held_.begin(); it != held_.end();) {
        GlobalAckStatus st = tier_->Renew(it->block, ttl_);
        if (st == GlobalAckStatus::kLost) return Lose();
        if (st == GlobalAckStatus::kStale) {
          Drop(*it, "was taken over by another host after its deadline passed");
          it = held_.erase(it);
          continue;
        }
        ++it;
      }
      next_renew_ = now + ttl_ / 3;
    }

    // Claims: keep two blocks of untaken tickets ahead of the takers (a
    // taker that runs dry wakes us at once, see WaitForDemand).
    if (feed_->ended() || now < next_claim_) return;
    uint64_t untaken = 0;
    for (const Held& h : held_) untaken += feed_->Untaken(h.block.tickets);
    while (untaken < 2 * tier_->job().block_size && held_.size() + 1 < kFedBlocks) {
      GlobalBlock block;
      milliseconds retry{0};
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
      FedBlockInfo info{block.first, block.last, block.generation};
      if (!feed_->Grant(info, block.tickets)) {
        // Out of this queue's range: the tier's keys do not match it. The
        // block expires unrenewed and goes to another host.
        Notice("queue '" + tier_->job().name + "': the coordinator handed out block [" +
               std::to_string(block.first) + ", " + std::to_string(block.last) +
               ") that this host's queue cannot hold; left to expire");
        next_claim_ = Clock::now() + milliseconds(1000);
        return;
      }
      untaken += feed_->Untaken(block.tickets);
      Held h;
      h.block = std::move(block);
      held_.push_back(std::move(h));
    }
  }

  const milliseconds ttl_;
  std::function<void(const std::string&)> on_notice_;
  std::unique_ptr<GlobalTier> tier_;
  LocalFeed* feed_ = nullptr;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  // The leader's view (the feeder thread's alone).
  std::vector<Held> held_;
  Clock::time_point next_renew_, next_claim_, failing_since_;
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
