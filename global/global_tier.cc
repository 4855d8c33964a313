// GlobalTier: the API over the scripts in scripts.cc.
#include "tailcut/global_tier.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <utility>

#include "global/redis_connection.h"
#include "global/scripts.h"
#include "global/tier_state.h"

namespace tailcut {

using detail::Reply;

namespace {

// Every notice of the tier goes to options.on_notice, or to stderr with the
// one "tailcut: " prefix every tailcut notice has (the lines themselves carry
// none, so a sink that adds it, like WorkQueue's, does not double it).
GlobalTierOptions WithNoticeSink(GlobalTierOptions options) {
  if (!options.on_notice) {
    options.on_notice = [](const std::string& line) {
      std::fprintf(stderr, "tailcut: %s\n", line.c_str());
    };
  }
  return options;
}

// A new run's id: unique enough that a job created again under its name
// never gets the id of the run before.
std::string NewRunId() {
  std::random_device device;
  uint64_t id = (uint64_t{device()} << 32 | device()) ^
                static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(id));
  return text;
}

// The loss a script answered with {'lost', what}; kNone for any other reply.
GlobalLoss LossOf(const redisReply* reply) {
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements == 0 ||
      reply->element[0]->type != REDIS_REPLY_STRING ||
      std::string_view(reply->element[0]->str, reply->element[0]->len) != "lost")
    return GlobalLoss::kNone;
  static const std::map<std::string_view, GlobalLoss> kWhat = {
      {"gone", GlobalLoss::kGone},       {"replaced", GlobalLoss::kReplaced},
      {"cursor", GlobalLoss::kCursor},   {"done", GlobalLoss::kDoneMarks},
      {"gen", GlobalLoss::kGenerations}, {"blocks", GlobalLoss::kOpenBlocks}};
  if (reply->elements < 2 || reply->element[1]->type != REDIS_REPLY_STRING)
    return GlobalLoss::kGone;
  auto it = kWhat.find(std::string_view(reply->element[1]->str, reply->element[1]->len));
  return it == kWhat.end() ? GlobalLoss::kGone : it->second;
}

std::string DefaultHostId() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return std::string(name) + ":" + std::to_string(getpid());
}

void CheckJobName(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 200;
  for (char c : name) ok = ok && c > ' ' && c != '{' && c != '}' && c != 0x7f;
  if (!ok) {
    throw Error(ErrorKind::kInvalidArgument,
                "global job name '" + name + "' must be 1..200 bytes without whitespace or braces");
  }
}

std::string_view Text(const redisReply* reply) {
  return reply->type == REDIS_REPLY_STRING || reply->type == REDIS_REPLY_STATUS
             ? std::string_view(reply->str, reply->len)
             : std::string_view();
}

uint64_t Unsigned(const redisReply* reply) {
  if (reply->type == REDIS_REPLY_INTEGER) return static_cast<uint64_t>(reply->integer);
  uint64_t value = 0;
  std::string_view text = Text(reply);
  std::from_chars(text.data(), text.data() + text.size(), value);
  return value;
}

}  // namespace

class GlobalTier::Impl {
 public:
  Impl(GlobalTierOptions options, CoordinatorAddress address)
      : options_(WithNoticeSink(std::move(options))),
        keys_(detail::JobKeys(options_.job.name)),
        redis_(std::move(address), options_.command_timeout, options_.retry_for,
               options_.on_notice) {}

  void CreateOrJoin() {
    const GlobalJob& job = options_.job;
    std::vector<std::string> args = {std::to_string(job.num_items),
                                     std::to_string(job.num_epochs),
                                     std::to_string(job.block_size),
                                     std::to_string(job.seed),
                                     job.files_fingerprint,
                                     job.seed_explicit ? "1" : "0",
                                     NewRunId()};
    if (!options_.restore_state.empty()) {
      detail::TierState saved = detail::ParseTierState(options_.restore_state);
      CheckField("num_items", std::to_string(saved.items), args[0], "the saved state");
      CheckField("num_epochs", std::to_string(saved.epochs), args[1], "the saved state");
      CheckField("block_size", std::to_string(saved.block), args[2], "the saved state");
      if (job.seed_explicit)
        CheckField("seed", std::to_string(saved.seed), args[3], "the saved state");
      else
        args[3] = std::to_string(saved.seed);  // a restored job keeps its order
      CheckField("files_fingerprint", saved.files, args[4], "the saved state");
      args.push_back(std::to_string(saved.cursor));
      args.push_back(saved.bitmap);
      args.push_back(options_.restore_token);
    }
    std::lock_guard lock(mu_);
    redis_.Connect();
    Reply reply = redis_.RunScript(detail::kCreateScript, keys_, args);
    std::string_view outcome = Text(reply->element[0]);
    if (outcome == "lost") {
      throw Error(ErrorKind::kCorrupt,
                  GlobalLossMessage(GlobalLoss::kGone, job.name, redis_.address().Display()));
    }
    if (outcome == "mismatch") {
      static const std::map<std::string_view, size_t> kIndex = {
          {"items", 0}, {"epochs", 1}, {"block", 2}, {"seed", 3}, {"files", 4}};
      static const std::map<std::string_view, std::string> kName = {{"items", "num_items"},
                                                                    {"epochs", "num_epochs"},
                                                                    {"block", "block_size"},
                                                                    {"seed", "seed"},
                                                                    {"files", "files_fingerprint"}};
      std::string_view field = Text(reply->element[1]);
      CheckField(kName.at(field), std::string(Text(reply->element[2])), args[kIndex.at(field)],
                 "the job on " + redis_.address().Display());
    }
    // The job's seed: ours if we created it or chose it, else the job's.
    options_.job.seed = std::stoull(std::string(Text(reply->element[1])));
    run_ = std::string(Text(reply->element[2]));
    Notice(std::string("global job '") + job.name + "' " +
           (outcome == "created" ? "created" : "joined") + " on " + redis_.address().Display() +
           " as host " + options_.host_id);
  }

  // expired_only: GlobalTier::ClaimExpired.
  GlobalClaimStatus Claim(std::chrono::milliseconds ttl, GlobalBlock* block,
                          std::chrono::milliseconds* retry_after, bool expired_only) {
    std::lock_guard lock(mu_);
    if (loss_ != GlobalLoss::kNone) return GlobalClaimStatus::kLost;
    std::vector<std::string> args = {run_, options_.host_id, std::to_string(ttl.count())};
    if (expired_only) args.push_back("expired");
    Reply reply = redis_.RunScript(detail::kClaimScript, keys_, args);
    if (Lost(reply.get())) return GlobalClaimStatus::kLost;
    std::string_view kind = Text(reply->element[0]);
    if (kind == "end") return GlobalClaimStatus::kEnd;
    if (kind == "wait") {
      if (retry_after != nullptr) {
        *retry_after = std::clamp(std::chrono::milliseconds(reply->element[1]->integer),
                                  std::chrono::milliseconds(1), std::chrono::milliseconds(1000));
      }
      return GlobalClaimStatus::kWait;
    }
    block->first = Unsigned(reply->element[1]);
    block->last = Unsigned(reply->element[2]);
    block->generation = Unsigned(reply->element[3]);
    block->reclaimed = kind == "reclaimed";
    block->tickets.clear();
    if (block->reclaimed) {
      const redisReply* tickets = reply->element[4];
      for (size_t i = 0; i < tickets->elements; ++i) {
        block->tickets.push_back(Unsigned(tickets->element[i]));
      }
    } else {
      for (uint64_t t = block->first; t < block->last; ++t) block->tickets.push_back(t);
    }
    return GlobalClaimStatus::kOk;
  }

  GlobalAckStatus Renew(const GlobalBlock& block, std::chrono::milliseconds ttl) {
    std::lock_guard lock(mu_);
    if (loss_ != GlobalLoss::kNone) return GlobalAckStatus::kLost;
    Reply reply = redis_.RunScript(detail::kRenewScript, keys_,
                                   {run_, options_.host_id, std::to_string(block.first),
                                    std::to_string(block.generation), std::to_string(ttl.count())});
    if (Lost(reply.get())) return GlobalAckStatus::kLost;
    std::string_view status = Text(reply->element[0]);
    if (status == "ok") return GlobalAckStatus::kOk;
    if (status == "closed") return GlobalAckStatus::kClosed;
    return GlobalAckStatus::kStale;
  }

  GlobalAckStatus Ack(const GlobalBlock& block, std::span<const uint64_t> tickets,
                      uint64_t* newly_done) {
    if (newly_done != nullptr) *newly_done = 0;
    std::lock_guard lock(mu_);
    if (loss_ != GlobalLoss::kNone) return GlobalAckStatus::kLost;
    std::vector<std::string> args = {run_, options_.host_id, std::to_string(block.first),
                                     std::to_string(block.generation)};
    for (uint64_t t : tickets) args.push_back(std::to_string(t));
    Reply reply = redis_.RunScript(detail::kAckScript, keys_, args);
    if (Lost(reply.get())) return GlobalAckStatus::kLost;
    std::string_view status = Text(reply->element[0]);
    if (newly_done != nullptr) {
      *newly_done = reply->elements > 1 ? Unsigned(reply->element[1]) : 0;
    }
    if (status == "stale") return GlobalAckStatus::kStale;
    if (status == "invalid") return GlobalAckStatus::kInvalid;
    return GlobalAckStatus::kOk;
  }

  // Connects, and throws kNotFound unless the job exists.
  void ConnectToExistingJob() {
    std::lock_guard lock(mu_);
    redis_.Connect();
    Reply reply = redis_.Run({"EXISTS", keys_[0]});
    if (reply->type == REDIS_REPLY_INTEGER && reply->integer == 0)
      throw Error(ErrorKind::kNotFound, "no job '" + options_.job.name + "' on " +
                                            redis_.address().Display() +
                                            " (never created, or its keys were deleted)");
  }

  GlobalStats Stats() {
    std::lock_guard lock(mu_);
    ThrowIfLost();
    Reply reply = redis_.RunScript(detail::kStatsScript, keys_, {run_});
    if (Lost(reply.get())) ThrowIfLost();
    GlobalStats stats;
    stats.job = options_.job.name;
    stats.coordinator = redis_.address().Display();
    stats.num_items = Unsigned(reply->element[0]);
    stats.num_epochs = Unsigned(reply->element[1]);
    stats.block_size = Unsigned(reply->element[2]);
    stats.done = Unsigned(reply->element[3]);
    stats.cursor = Unsigned(reply->element[4]);
    stats.total = stats.num_items * stats.num_epochs;
    const redisReply* open = reply->element[5];
    for (size_t i = 0; i < open->elements; ++i) {
      const redisReply* b = open->element[i];
      GlobalOpenBlock block;
      block.first = Unsigned(b->element[0]);
      block.last = std::min(block.first + stats.block_size, stats.total);
      block.host_id = std::string(Text(b->element[1]));
      block.generation = Unsigned(b->element[2]);
      block.deadline_in_ms = b->element[3]->integer;
      block.left = Unsigned(b->element[4]);
      stats.open_blocks.push_back(std::move(block));
    }
    std::sort(stats.open_blocks.begin(), stats.open_blocks.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    std::map<std::string, GlobalHostStats> hosts;
    const redisReply* counters = reply->element[6];
    for (size_t i = 0; i + 1 < counters->elements; i += 2) {
      std::string_view field = Text(counters->element[i]);
      size_t colon = field.find(':');
      std::string host(field.substr(colon + 1));
      std::string_view what = field.substr(0, colon);
      GlobalHostStats& h = hosts[host];
      h.host_id = host;
      uint64_t value = Unsigned(counters->element[i + 1]);
      if (what == "claims") h.claims = value;
      if (what == "reclaims") h.reclaims = value;
      if (what == "acked") h.acked = value;
      if (what == "stale_acks") h.stale_acks = value;
      if (what == "stale_renews") h.stale_renews = value;
    }
    for (auto& [name, h] : hosts) {
      stats.stale_acks += h.stale_acks;
      stats.hosts.push_back(std::move(h));
    }
    return stats;
  }

  std::string SaveState() {
    std::lock_guard lock(mu_);
    ThrowIfLost();
    Reply reply = redis_.RunScript(detail::kSaveScript, keys_, {run_});
    if (Lost(reply.get())) ThrowIfLost();
    const GlobalJob& job = options_.job;
    return detail::SerializeTierState({job.num_items, job.num_epochs, job.block_size, job.seed,
                                       Unsigned(reply->element[0]), job.files_fingerprint,
                                       std::string(Text(reply->element[1]))});
  }

  const GlobalTierOptions& options() const noexcept { return options_; }
  GlobalLoss loss() const noexcept {
    std::lock_guard lock(mu_);
    return loss_;
  }
  std::string coordinator() const { return redis_.address().Display(); }
  const std::string& run_id() const noexcept { return run_; }

 private:
  void Notice(const std::string& line) { options_.on_notice(line); }

  // Records the loss a script answered, if any (the first one stays).
  // REQUIRES: mu_ held.
  bool Lost(const redisReply* reply) {
    GlobalLoss loss = LossOf(reply);
    if (loss == GlobalLoss::kNone) return false;
    if (loss_ == GlobalLoss::kNone) loss_ = loss;
    return true;
  }

  // REQUIRES: mu_ held.
  void ThrowIfLost() const {
    if (loss_ != GlobalLoss::kNone)
      throw Error(ErrorKind::kCorrupt,
                  GlobalLossMessage(loss_, options_.job.name, redis_.address().Display()));
  }

  // Throws kConfigMismatch naming the field unless `have` == `want`.
  void CheckField(const std::string& field, const std::string& have, const std::string& want,
                  const std::string& where) const {
    if (have == want) return;
    throw Error(ErrorKind::kConfigMismatch,
                "global job '" + options_.job.name + "': " + field + " is " + have + " in " +
                    where + " but " + want +
                    " on this host: every host must use the same configuration (or another job "
                    "name)");
  }

  GlobalTierOptions options_;
  std::vector<std::string> keys_;
  mutable std::mutex mu_;  // serializes use of redis_; guards run_ and loss_
  std::string run_ = "*";  // the run Open created or joined; '*' (any) for Inspect
  GlobalLoss loss_ = GlobalLoss::kNone;
  detail::RedisConnection redis_;
};

std::unique_ptr<GlobalTier> GlobalTier::Open(GlobalTierOptions options) {
  CheckJobName(options.job.name);
  if (options.job.num_items == 0 || options.job.num_epochs == 0 || options.job.block_size == 0) {
    throw Error(ErrorKind::kInvalidArgument, "global job '" + options.job.name +
                                                 "': num_items, num_epochs and block_size must be "
                                                 "at least 1");
  }
  if (options.host_id.empty()) options.host_id = DefaultHostId();
  CoordinatorAddress address = CoordinatorFromEnvironment(options.coordinator);
  auto impl = std::make_unique<Impl>(std::move(options), std::move(address));
  impl->CreateOrJoin();
  return std::unique_ptr<GlobalTier>(new GlobalTier(std::move(impl)));
}

GlobalStats GlobalTier::Inspect(GlobalTierOptions options) {
  CheckJobName(options.job.name);
  if (options.host_id.empty()) options.host_id = DefaultHostId();
  CoordinatorAddress address = CoordinatorFromEnvironment(options.coordinator);
  Impl impl(std::move(options), std::move(address));
  impl.ConnectToExistingJob();
  return impl.Stats();
}

GlobalTier::GlobalTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GlobalTier::~GlobalTier() = default;

GlobalClaimStatus GlobalTier::Claim(std::chrono::milliseconds ttl, GlobalBlock* block,
                                    std::chrono::milliseconds* retry_after) {
  return impl_->Claim(ttl, block, retry_after, /*expired_only=*/false);
}
GlobalClaimStatus GlobalTier::ClaimExpired(std::chrono::milliseconds ttl, GlobalBlock* block,
                                           std::chrono::milliseconds* retry_after) {
  return impl_->Claim(ttl, block, retry_after, /*expired_only=*/true);
}
GlobalAckStatus GlobalTier::Renew(const GlobalBlock& block, std::chrono::milliseconds ttl) {
  return impl_->Renew(block, ttl);
}
GlobalAckStatus GlobalTier::Ack(const GlobalBlock& block, std::span<const uint64_t> tickets,
                                uint64_t* newly_done) {
  return impl_->Ack(block, tickets, newly_done);
}
GlobalStats GlobalTier::Stats() { return impl_->Stats(); }
std::string GlobalTier::SaveState() { return impl_->SaveState(); }
GlobalLoss GlobalTier::loss() const noexcept { return impl_->loss(); }
std::string GlobalTier::coordinator() const { return impl_->coordinator(); }
const std::string& GlobalTier::run_id() const noexcept { return impl_->run_id(); }
const std::string& GlobalTier::host_id() const noexcept { return impl_->options().host_id; }
const GlobalJob& GlobalTier::job() const noexcept { return impl_->options().job; }

}  // namespace tailcut
