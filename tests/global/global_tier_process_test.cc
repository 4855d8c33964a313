// GlobalTier across real processes: three simulated hosts (forked processes,
// several threads each) against a redis-server of the test's own. Each host
// records every ticket whose ack Redis accepted; the parent checks that the
// records of all hosts tile [0, items * epochs) exactly once, also when a
// host is killed, paused past its TTL, or Redis itself crashes and restarts.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <thread>

#include "global/redis_server.h"
#include "tailcut/global_tier.h"

namespace tailcut {
namespace {

using std::chrono::milliseconds;
using testing::RedisServer;

constexpr uint64_t kItems = 400;
constexpr uint64_t kEpochs = 3;
constexpr uint64_t kBlock = 8;
constexpr int kHosts = 3;
constexpr int kThreadsPerHost = 3;

GlobalTierOptions Options(const std::string& url, const std::string& host) {
  GlobalTierOptions options;
  options.coordinator = url;
  options.host_id = host;
  options.job = {"epochs", kItems, kEpochs, kBlock, 11, "files"};
  options.retry_for = milliseconds(15000);
  options.command_timeout = milliseconds(1000);
  options.on_notice = [](const std::string&) {};
  return options;
}

struct HostSpec {
  std::string url;
  std::string host_id;
  std::string records_path;  // uint64 tickets whose ack was accepted
  std::string result_path;   // "stale_acks stale_renews" seen by the host
  milliseconds ttl{1000};
  milliseconds work_per_ticket{1};
  int pause_after_acks = 0;  // > 0: after that many acks, stop mid-block
  int notify_fd = -1;        // one byte: paused
  int go_fd = -1;            // one byte: go on
};

// The body of one simulated host; returns its exit status.
int RunHost(const HostSpec& spec) {
  std::unique_ptr<GlobalTier> tier;
  try {
    tier = GlobalTier::Open(Options(spec.url, spec.host_id));
  } catch (const Error& e) {
    fprintf(stderr, "%s: %s\n", spec.host_id.c_str(), e.what());
    return 2;
  }
  int records = open(spec.records_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  std::mutex commit_mu;  // an ack and its record happen together
  std::atomic<int> acks{0}, stale_acks{0}, stale_renews{0}, failures{0};
  bool paused = false;  // guarded by commit_mu
  auto worker = [&] {
    try {
      GlobalBlock block;
      milliseconds retry{0};
      for (;;) {
        GlobalClaimStatus status = tier->Claim(spec.ttl, &block, &retry);
        if (status == GlobalClaimStatus::kEnd) return;
        if (status == GlobalClaimStatus::kWait) {
          std::this_thread::sleep_for(retry);
          continue;
        }
        for (size_t i = 0; i < block.tickets.size(); i += 2) {
          std::this_thread::sleep_for(spec.work_per_ticket * 2);
          std::span<const uint64_t> chunk(block.tickets.data() + i,
                                          std::min<size_t>(2, block.tickets.size() - i));
          std::lock_guard lock(commit_mu);
          GlobalAckStatus acked = tier->Ack(block, chunk);
          if (acked == GlobalAckStatus::kStale) {
            ++stale_acks;
            break;  // the block went to another host: drop it
          }
          if (acked != GlobalAckStatus::kOk) ++failures;
          write(records, chunk.data(), chunk.size_bytes());
          bool rest = i + 2 < block.tickets.size();
          if (++acks == spec.pause_after_acks && rest && !paused) {
            paused = true;
            char byte = 'p';
            write(spec.notify_fd, &byte, 1);
            read(spec.go_fd, &byte, 1);  // SIGKILL or SIGSTOP arrives here
            // Back after the TTL: the block was re-owned, so both are refused.
            if (tier->Renew(block, spec.ttl) == GlobalAckStatus::kStale) ++stale_renews;
          }
        }
      }
    } catch (const Error& e) {
      fprintf(stderr, "%s: %s\n", spec.host_id.c_str(), e.what());
      ++failures;
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreadsPerHost; ++i) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  close(records);
  std::ofstream(spec.result_path) << stale_acks << " " << stale_renews << "\n";
  return failures == 0 ? 0 : 1;
}

class GlobalTierProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/tailcut-global-test-XXXXXX";
    dir_ = mkdtemp(dir);
  }
  void TearDown() override {
    for (pid_t pid : pids_) {
      if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
    std::filesystem::remove_all(dir_);
  }

  HostSpec Spec(const std::string& url, int host) {
    HostSpec spec;
    spec.url = url;
    spec.host_id = "host" + std::to_string(host);
    spec.records_path = dir_ + "/" + spec.host_id + ".records";
    spec.result_path = dir_ + "/" + spec.host_id + ".result";
    return spec;
  }

  void Start(const HostSpec& spec) {
    pid_t pid = fork();
    if (pid == 0) _exit(RunHost(spec));
    pids_.push_back(pid);
  }

  // Waits for host i; returns its exit status (-signal if killed).
  int Wait(int i) {
    int status = 0;
    waitpid(pids_[i], &status, 0);
    pids_[i] = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }

  // Every ticket of every epoch recorded by exactly one accepted ack.
  void ExpectEachTicketExactlyOnce() {
    std::vector<int> seen(kItems * kEpochs, 0);
    for (int h = 0; h < kHosts; ++h) {
      std::ifstream in(Spec("", h).records_path, std::ios::binary);
      uint64_t t;
      while (in.read(reinterpret_cast<char*>(&t), sizeof(t))) {
        ASSERT_LT(t, seen.size());
        ++seen[t];
      }
    }
    int missing = 0, doubled = 0;
    for (int n : seen) {
      missing += n == 0;
      doubled += n > 1;
    }
    EXPECT_EQ(missing, 0);
    EXPECT_EQ(doubled, 0);
  }

  std::pair<int, int> Result(int host) {
    std::ifstream in(Spec("", host).result_path);
    int stale_acks = -1, stale_renews = -1;
    in >> stale_acks >> stale_renews;
    return {stale_acks, stale_renews};
  }

  std::string dir_;
  std::vector<pid_t> pids_;
};

TEST_F(GlobalTierProcessTest, ThreeHostsDoEveryTicketOfThreeEpochsExactlyOnce) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  for (int h = 0; h < kHosts; ++h) Start(Spec(redis.url(), h));
  for (int h = 0; h < kHosts; ++h) EXPECT_EQ(Wait(h), 0) << "host" << h;
  ExpectEachTicketExactlyOnce();
  GlobalStats stats = GlobalTier::Open(Options(redis.url(), "parent"))->Stats();
  EXPECT_EQ(stats.done, kItems * kEpochs);
  EXPECT_EQ(stats.stale_acks, 0u);
  ASSERT_EQ(stats.hosts.size(), 3u);
  for (const GlobalHostStats& h : stats.hosts) EXPECT_GT(h.acked, 0u) << h.host_id;
}

TEST_F(GlobalTierProcessTest, AKilledHostsBlocksExpireAndOnlyTheirUndoneTicketsAreRedone) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  int notify[2], go[2];
  ASSERT_EQ(pipe(notify), 0);
  ASSERT_EQ(pipe(go), 0);
  HostSpec victim = Spec(redis.url(), 0);
  victim.pause_after_acks = 5;
  victim.notify_fd = notify[1];
  victim.go_fd = go[0];
  Start(victim);
  for (int h = 1; h < kHosts; ++h) Start(Spec(redis.url(), h));
  char byte;
  ASSERT_EQ(read(notify[0], &byte, 1), 1);
  kill(pids_[0], SIGKILL);  // mid-block, with tickets of it done and others not
  EXPECT_EQ(Wait(0), -SIGKILL);
  for (int h = 1; h < kHosts; ++h) EXPECT_EQ(Wait(h), 0) << "host" << h;
  ExpectEachTicketExactlyOnce();
  GlobalStats stats = GlobalTier::Open(Options(redis.url(), "parent"))->Stats();
  EXPECT_EQ(stats.done, kItems * kEpochs);
  uint64_t reclaims = 0;
  for (const GlobalHostStats& h : stats.hosts) reclaims += h.reclaims;
  EXPECT_GE(reclaims, 1u);
}

TEST_F(GlobalTierProcessTest, AHostPausedPastItsTtlIsRefusedWhenItComesBack) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  int notify[2], go[2];
  ASSERT_EQ(pipe(notify), 0);
  ASSERT_EQ(pipe(go), 0);
  HostSpec paused = Spec(redis.url(), 0);
  paused.pause_after_acks = 5;
  paused.notify_fd = notify[1];
  paused.go_fd = go[0];
  Start(paused);
  for (int h = 1; h < kHosts; ++h) Start(Spec(redis.url(), h));
  char byte = 'g';
  ASSERT_EQ(read(notify[0], &byte, 1), 1);
  kill(pids_[0], SIGSTOP);
  // The others finish the job, the paused host's blocks included.
  for (int h = 1; h < kHosts; ++h) EXPECT_EQ(Wait(h), 0) << "host" << h;
  auto parent = GlobalTier::Open(Options(redis.url(), "parent"));
  EXPECT_EQ(parent->Stats().done, kItems * kEpochs);
  ASSERT_EQ(write(go[1], &byte, 1), 1);
  kill(pids_[0], SIGCONT);
  EXPECT_EQ(Wait(0), 0);
  ExpectEachTicketExactlyOnce();
  auto [stale_acks, stale_renews] = Result(0);
  EXPECT_GE(stale_acks, 1);
  EXPECT_EQ(stale_renews, 1);
  GlobalStats stats = parent->Stats();
  ASSERT_EQ(stats.hosts[0].host_id, "host0");
  EXPECT_EQ(stats.hosts[0].stale_acks, static_cast<uint64_t>(stale_acks));
  EXPECT_EQ(stats.hosts[0].stale_renews, 1u);
  EXPECT_EQ(stats.stale_acks, static_cast<uint64_t>(stale_acks));
  EXPECT_EQ(stats.done, kItems * kEpochs);
}

TEST_F(GlobalTierProcessTest, RedisCrashingAndRestartingMidEpochKeepsExactlyOnce) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;  // appendonly yes, appendfsync always
  for (int h = 0; h < kHosts; ++h) {
    HostSpec spec = Spec(redis.url(), h);
    spec.ttl = milliseconds(3000);
    spec.work_per_ticket = milliseconds(2);
    Start(spec);
  }
  {
    auto parent = GlobalTier::Open(Options(redis.url(), "parent"));
    while (parent->Stats().done < kItems * kEpochs / 3) {
      std::this_thread::sleep_for(milliseconds(5));
    }
    GlobalStats before = parent->Stats();
    ASSERT_LT(before.done, kItems * kEpochs) << "the job ended before Redis was killed";
  }
  redis.Kill();  // SIGKILL: a crash, not a shutdown
  std::this_thread::sleep_for(milliseconds(500));
  redis.Start();  // same port and dir: replays the append-only file
  for (int h = 0; h < kHosts; ++h) EXPECT_EQ(Wait(h), 0) << "host" << h;
  ExpectEachTicketExactlyOnce();
  GlobalStats stats = GlobalTier::Open(Options(redis.url(), "parent"))->Stats();
  EXPECT_EQ(stats.done, kItems * kEpochs);
}

}  // namespace
}  // namespace tailcut
