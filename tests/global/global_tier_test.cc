// GlobalTier in one process against a redis-server of the test's own:
// URLs, blocks, acks, fencing, end of data, state, and the named errors.
#include "tailcut/global_tier.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "engine/checkpoint.h"
#include "global/redis_server.h"

namespace tailcut {
namespace {

using std::chrono::milliseconds;
using testing::RedisServer;

GlobalTierOptions Options(const std::string& url, const std::string& host, uint64_t items = 10,
                          uint64_t epochs = 1, uint64_t block = 4) {
  GlobalTierOptions options;
  options.coordinator = url;
  options.host_id = host;
  options.job = {"job", items, epochs, block, 7, "files-v1"};
  options.retry_for = milliseconds(3000);
  options.on_notice = [](const std::string&) {};
  return options;
}

// Runs redis-cli against the test's server, e.g. "FLUSHALL".
void RedisCli(const RedisServer& redis, const std::string& args) {
  std::string command =
      "redis-cli -p " + std::to_string(redis.port()) + " " + args + " > /dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
}

std::vector<uint64_t> Range(uint64_t first, uint64_t last) {
  std::vector<uint64_t> v;
  for (uint64_t t = first; t < last; ++t) v.push_back(t);
  return v;
}

TEST(CoordinatorUrlTest, ParsesEveryPart) {
  CoordinatorAddress a = ParseCoordinatorUrl("redis://alice:s3cret@db.example:6380/2");
  EXPECT_EQ(a.host, "db.example");
  EXPECT_EQ(a.port, 6380);
  EXPECT_EQ(a.db, 2);
  EXPECT_EQ(a.user, "alice");
  EXPECT_EQ(a.password, "s3cret");
  EXPECT_EQ(a.Display(), "redis://alice@db.example:6380/2");
  CoordinatorAddress b = ParseCoordinatorUrl("redis://10.0.0.1:7000");
  EXPECT_EQ(b.port, 7000);
  EXPECT_EQ(b.db, 0);
  EXPECT_EQ(b.Display(), "redis://10.0.0.1:7000/0");
  CoordinatorAddress c = ParseCoordinatorUrl("redis://:pw@h:1/0");
  EXPECT_EQ(c.user, "");
  EXPECT_EQ(c.password, "pw");
}

TEST(CoordinatorUrlTest, BadUrlsNameThePartAndNeverThePassword) {
  try {
    ParseCoordinatorUrl("redis://bob:hunter2@h:notaport/0");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_STREQ(e.what(),
                 "coordinator URL 'redis://***@h:notaport/0': the port is not a number "
                 "in 1..65535; expected redis://[user[:password]@]HOST:PORT/DB");
  }
  EXPECT_THROW(ParseCoordinatorUrl("http://h:1/0"), Error);
  EXPECT_THROW(ParseCoordinatorUrl("redis://h:1/x"), Error);
  EXPECT_THROW(ParseCoordinatorUrl("redis://:1/0"), Error);
}

// A NUL once cut the URL: hiredis connected to the host name before it.
TEST(CoordinatorUrlTest, ControlCharactersAreRefusedAndShownEscaped) {
  using namespace std::string_literals;
  try {
    ParseCoordinatorUrl("redis://h\0st.example:6379/0"s);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_STREQ(e.what(),
                 "coordinator URL 'redis://h\\x00st.example:6379/0': it contains the "
                 "control character '\\x00'; remove it; expected "
                 "redis://[user[:password]@]HOST:PORT/DB");
  }
  for (std::string url :
       {"redis://h:6379/0\n"s, "redis://h\t:1/0"s, "\x7fredis://h:1/0"s, "redis://u:p\0w@h:1/0"s}) {
    try {
      ParseCoordinatorUrl(url);
      ADD_FAILURE() << Printable(url);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("control character"), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find("p\\x00w"), std::string::npos) << "password shown";
    }
  }
}

TEST(CoordinatorUrlTest, EnvironmentGivesUrlAndPassword) {
  setenv("TAILCUT_COORDINATOR", "redis://carol@h:6379/1", 1);
  setenv("TAILCUT_REDIS_PASSWORD", "from-env", 1);
  CoordinatorAddress a = CoordinatorFromEnvironment();
  EXPECT_EQ(a.user, "carol");
  EXPECT_EQ(a.password, "from-env");
  EXPECT_EQ(a.db, 1);
  // A password in the URL wins.
  EXPECT_EQ(CoordinatorFromEnvironment("redis://u:inurl@h:1/0").password, "inurl");
  unsetenv("TAILCUT_COORDINATOR");
  unsetenv("TAILCUT_REDIS_PASSWORD");
  EXPECT_THROW(CoordinatorFromEnvironment(), Error);
}

TEST(GlobalTierTest, ClaimHandsOutAlignedBlocksThenEndsWhenAllAreDone) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  auto tier = GlobalTier::Open(Options(redis.url(), "a"));
  std::vector<GlobalBlock> blocks;
  GlobalBlock block;
  while (tier->Claim(milliseconds(60000), &block) == GlobalClaimStatus::kOk) {
    EXPECT_FALSE(block.reclaimed);
    EXPECT_EQ(block.generation, 1u);
    blocks.push_back(block);
  }
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[0].tickets, Range(0, 4));
  EXPECT_EQ(blocks[1].tickets, Range(4, 8));
  EXPECT_EQ(blocks[2].tickets, Range(8, 10));  // the last block is short
  milliseconds retry{0};
  EXPECT_EQ(tier->Claim(milliseconds(60000), &block, &retry), GlobalClaimStatus::kWait);
  EXPECT_EQ(retry, milliseconds(1000));
  for (const GlobalBlock& b : blocks) {
    EXPECT_EQ(tier->Ack(b, b.tickets), GlobalAckStatus::kOk);
  }
  EXPECT_EQ(tier->Claim(milliseconds(60000), &block), GlobalClaimStatus::kEnd);
  GlobalStats stats = tier->Stats();
  EXPECT_EQ(stats.done, 10u);
  EXPECT_EQ(stats.total, 10u);
  EXPECT_TRUE(stats.open_blocks.empty());
  ASSERT_EQ(stats.hosts.size(), 1u);
  EXPECT_EQ(stats.hosts[0].claims, 3u);
  EXPECT_EQ(stats.hosts[0].acked, 10u);
}

TEST(GlobalTierTest, AckingATicketTwiceCountsOnceAndOutsideTheBlockIsInvalid) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  auto tier = GlobalTier::Open(Options(redis.url(), "a"));
  GlobalBlock block;
  ASSERT_EQ(tier->Claim(milliseconds(60000), &block), GlobalClaimStatus::kOk);
  uint64_t newly = 99;
  std::vector<uint64_t> some = {0, 1};
  EXPECT_EQ(tier->Ack(block, some, &newly), GlobalAckStatus::kOk);
  EXPECT_EQ(newly, 2u);
  EXPECT_EQ(tier->Ack(block, some, &newly), GlobalAckStatus::kOk);
  EXPECT_EQ(newly, 0u);
  std::vector<uint64_t> outside = {3, 4};
  EXPECT_EQ(tier->Ack(block, outside, &newly), GlobalAckStatus::kInvalid);
  EXPECT_EQ(tier->Stats().done, 2u);
  // The block stays open until its last ticket is done, then Renew says so.
  EXPECT_EQ(tier->Renew(block, milliseconds(60000)), GlobalAckStatus::kOk);
  EXPECT_EQ(tier->Ack(block, block.tickets, &newly), GlobalAckStatus::kOk);
  EXPECT_EQ(newly, 2u);
  EXPECT_EQ(tier->Renew(block, milliseconds(60000)), GlobalAckStatus::kClosed);
  EXPECT_EQ(tier->Stats().open_blocks.size(), 0u);
}

TEST(GlobalTierTest, AnExpiredBlockIsReownedWithOnlyItsUndoneTicketsAndTheOldHolderIsFenced) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  auto a = GlobalTier::Open(Options(redis.url(), "a"));
  auto b = GlobalTier::Open(Options(redis.url(), "b"));
  GlobalBlock held;
  ASSERT_EQ(a->Claim(milliseconds(100), &held), GlobalClaimStatus::kOk);
  std::vector<uint64_t> done = {1, 2};
  ASSERT_EQ(a->Ack(held, done), GlobalAckStatus::kOk);
  std::this_thread::sleep_for(milliseconds(150));
  GlobalBlock taken;
  ASSERT_EQ(b->Claim(milliseconds(60000), &taken), GlobalClaimStatus::kOk);
  EXPECT_TRUE(taken.reclaimed);
  EXPECT_EQ(taken.first, 0u);
  EXPECT_EQ(taken.generation, 2u);
  EXPECT_EQ(taken.tickets, (std::vector<uint64_t>{0, 3}));
  // The old holder's late renew and ack are refused and counted.
  EXPECT_EQ(a->Renew(held, milliseconds(60000)), GlobalAckStatus::kStale);
  std::vector<uint64_t> late = {0};
  uint64_t newly = 99;
  EXPECT_EQ(a->Ack(held, late, &newly), GlobalAckStatus::kStale);
  EXPECT_EQ(newly, 0u);
  EXPECT_EQ(b->Ack(taken, taken.tickets), GlobalAckStatus::kOk);
  GlobalStats stats = b->Stats();
  EXPECT_EQ(stats.done, 4u);
  EXPECT_EQ(stats.stale_acks, 1u);
  ASSERT_EQ(stats.hosts.size(), 2u);
  EXPECT_EQ(stats.hosts[0].host_id, "a");
  EXPECT_EQ(stats.hosts[0].stale_acks, 1u);
  EXPECT_EQ(stats.hosts[0].stale_renews, 1u);
  EXPECT_EQ(stats.hosts[1].reclaims, 1u);
}

// What a host with work enough asks for (the host feeder, between claims):
// a dead host's block once it expires, and never a new block of the cursor.
TEST(GlobalTierTest, ClaimExpiredReownsOnlyAnExpiredBlockAndNeverTakesANewOne) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  auto a = GlobalTier::Open(Options(redis.url(), "a"));
  auto b = GlobalTier::Open(Options(redis.url(), "b"));
  GlobalBlock held, got;
  ASSERT_EQ(a->Claim(milliseconds(300), &held), GlobalClaimStatus::kOk);
  std::vector<uint64_t> done = {0};
  ASSERT_EQ(a->Ack(held, done), GlobalAckStatus::kOk);
  // Not expired yet: a wait until its deadline, and the cursor stays.
  milliseconds retry{0};
  EXPECT_EQ(b->ClaimExpired(milliseconds(60000), &got, &retry), GlobalClaimStatus::kWait);
  EXPECT_GT(retry.count(), 0);
  EXPECT_LE(retry.count(), 300);
  EXPECT_EQ(b->Stats().cursor, 4u);
  std::this_thread::sleep_for(milliseconds(350));
  ASSERT_EQ(b->ClaimExpired(milliseconds(60000), &got, &retry), GlobalClaimStatus::kOk);
  EXPECT_TRUE(got.reclaimed);
  EXPECT_EQ(got.first, 0u);
  EXPECT_EQ(got.generation, 2u);
  EXPECT_EQ(got.tickets, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(a->Renew(held, milliseconds(60000)), GlobalAckStatus::kStale);
  // Nothing else expired: a wait again, though the cursor has blocks left.
  EXPECT_EQ(b->ClaimExpired(milliseconds(60000), &got, &retry), GlobalClaimStatus::kWait);
  GlobalStats stats = b->Stats();
  EXPECT_EQ(stats.cursor, 4u);
  ASSERT_EQ(stats.hosts.size(), 2u);
  EXPECT_EQ(stats.hosts[1].claims, 1u);
  EXPECT_EQ(stats.hosts[1].reclaims, 1u);
}

TEST(GlobalTierTest, StatsShowOpenBlocksPerHostWithDeadlines) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  auto a = GlobalTier::Open(Options(redis.url(), "a"));
  auto b = GlobalTier::Open(Options(redis.url(), "b"));
  GlobalBlock x, y;
  ASSERT_EQ(a->Claim(milliseconds(30000), &x), GlobalClaimStatus::kOk);
  ASSERT_EQ(b->Claim(milliseconds(5000), &y), GlobalClaimStatus::kOk);
  GlobalStats stats = a->Stats();
  EXPECT_EQ(stats.cursor, 8u);
  EXPECT_EQ(stats.coordinator, redis.url());
  ASSERT_EQ(stats.open_blocks.size(), 2u);
  EXPECT_EQ(stats.open_blocks[0].host_id, "a");
  EXPECT_GT(stats.open_blocks[0].deadline_in_ms, 25000);
  EXPECT_EQ(stats.open_blocks[1].host_id, "b");
  EXPECT_LE(stats.open_blocks[1].deadline_in_ms, 5000);
  EXPECT_EQ(stats.open_blocks[1].left, 4u);
}

TEST(GlobalTierTest, AFlushedScriptCacheIsSurvived) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  auto tier = GlobalTier::Open(Options(redis.url(), "a"));
  auto admin = GlobalTier::Open(Options(redis.url(), "admin"));
  GlobalBlock block;
  ASSERT_EQ(tier->Claim(milliseconds(60000), &block), GlobalClaimStatus::kOk);
  ASSERT_EQ(
      std::system(
          ("redis-cli -p " + std::to_string(redis.port()) + " SCRIPT FLUSH > /dev/null").c_str()),
      0);
  EXPECT_EQ(tier->Ack(block, block.tickets), GlobalAckStatus::kOk);  // NOSCRIPT, then EVAL
  EXPECT_EQ(tier->Stats().done, 4u);
}

TEST(GlobalTierTest, ARestoredStateHandsOutOnlyTicketsNotDone) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  std::string state;
  {
    auto tier = GlobalTier::Open(Options(redis.url(), "a"));
    GlobalBlock first, second;
    ASSERT_EQ(tier->Claim(milliseconds(60000), &first), GlobalClaimStatus::kOk);
    ASSERT_EQ(tier->Claim(milliseconds(60000), &second), GlobalClaimStatus::kOk);
    ASSERT_EQ(tier->Ack(first, first.tickets), GlobalAckStatus::kOk);
    std::vector<uint64_t> half = {5, 6};
    ASSERT_EQ(tier->Ack(second, half), GlobalAckStatus::kOk);
    state = tier->SaveState();
  }
  GlobalTierOptions options = Options(redis.url(), "b");
  options.job.name = "job-restored";
  options.restore_state = state;
  auto tier = GlobalTier::Open(options);
  GlobalStats stats = tier->Stats();
  EXPECT_EQ(stats.cursor, 8u);
  EXPECT_EQ(stats.done, 6u);
  std::vector<uint64_t> handed;
  GlobalBlock block;
  while (tier->Claim(milliseconds(60000), &block) == GlobalClaimStatus::kOk) {
    handed.insert(handed.end(), block.tickets.begin(), block.tickets.end());
    ASSERT_EQ(tier->Ack(block, block.tickets), GlobalAckStatus::kOk);
  }
  EXPECT_EQ(handed, (std::vector<uint64_t>{4, 7, 8, 9}));
  EXPECT_EQ(tier->Claim(milliseconds(60000), &block), GlobalClaimStatus::kEnd);

  // A state of another configuration is refused, naming the field.
  GlobalTierOptions other = Options(redis.url(), "c", 10, 1, 8);
  other.job.name = "job-other";
  other.restore_state = state;
  try {
    GlobalTier::Open(other);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfigMismatch);
    EXPECT_STREQ(e.what(),
                 "global job 'job-other': block_size is 4 in the saved state but 8 on "
                 "this host: every host must use the same configuration (or another job name)");
  }
  other.restore_state = "garbage";
  EXPECT_THROW(GlobalTier::Open(other), Error);
}

TEST(GlobalTierTest, ARestoreWithATokenReplacesTheRunItCameFromAndItsHostsJoinIt) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  // The run a checkpoint is saved from goes on past it (block [0, 4) done).
  auto old_run = GlobalTier::Open(Options(redis.url(), "a"));
  GlobalBlock block;
  ASSERT_EQ(old_run->Claim(milliseconds(60000), &block), GlobalClaimStatus::kOk);
  const std::string state = old_run->SaveState();  // nothing done yet
  ASSERT_EQ(old_run->Ack(block, block.tickets), GlobalAckStatus::kOk);
  // Without a token the state is ignored: the job exists, and is joined.
  GlobalTierOptions plain = Options(redis.url(), "b");
  plain.restore_state = state;
  EXPECT_EQ(GlobalTier::Open(plain)->run_id(), old_run->run_id());
  // The hosts of a restore share a token: the first replaces the old run, the
  // others join the new one, whose state is the checkpoint's.
  GlobalTierOptions restore = Options(redis.url(), "a");
  restore.restore_state = state;
  restore.restore_token = "restore-1";
  auto a = GlobalTier::Open(restore);
  EXPECT_NE(a->run_id(), old_run->run_id());
  restore.host_id = "b";
  auto b = GlobalTier::Open(restore);
  EXPECT_EQ(b->run_id(), a->run_id());
  EXPECT_EQ(a->Stats().done, 0u);
  EXPECT_EQ(a->Stats().cursor, 4u);
  // The old run's hosts are refused: the job is another run now.
  EXPECT_EQ(old_run->Claim(milliseconds(60000), &block), GlobalClaimStatus::kLost);
  EXPECT_EQ(old_run->loss(), GlobalLoss::kReplaced);
  // Every ticket once in the restored run: block [0, 4) again, then the rest.
  std::vector<uint64_t> handed;
  for (GlobalTier* tier : {a.get(), b.get(), a.get(), b.get()}) {
    ASSERT_EQ(tier->Claim(milliseconds(60000), &block), GlobalClaimStatus::kOk);
    handed.insert(handed.end(), block.tickets.begin(), block.tickets.end());
    ASSERT_EQ(tier->Ack(block, block.tickets), GlobalAckStatus::kOk);
    if (handed.size() == 10) break;
  }
  std::sort(handed.begin(), handed.end());
  EXPECT_EQ(handed, Range(0, 10));
  // A second restore from the same checkpoint (the restored run crashed too)
  // has a token of its own: it replaces the restored run.
  restore.restore_token = "restore-2";
  auto again = GlobalTier::Open(restore);
  EXPECT_NE(again->run_id(), a->run_id());
  EXPECT_EQ(again->Stats().done, 0u);
}

// A host's queue state (engine/checkpoint.h) of 10 items, 1 epoch, seed 7,
// with tickets below `cursor` done where `done` has a bit.
std::string HostState(uint64_t cursor, uint64_t done, uint64_t seed = 7) {
  detail::SavedState s;
  s.fingerprint = 0x1234;
  s.num_items = 10;
  s.num_epochs = 1;
  s.seed = seed;
  s.cursor = cursor;
  s.words = {done};
  return detail::SerializeState(s);
}

TEST(GlobalStateWithHostsTest, TheDoneMarksAreTheHostsNotTheTiers) {
  // The tier handed out two blocks and counts tickets 4 and 5 done (acked
  // after the hosts' states were saved): not done in the checkpoint.
  const std::string files = "0000000000001234";
  const std::string tier =
      "tailcut-global-state 1 10 1 4 7 8 16 1\n" + files + std::string(1, '\x0c');
  const std::string a = HostState(8, 0b1011), b = HostState(8, 0b10000100);
  // Tickets 0, 1, 3 (host a) and 2, 7 (host b): bits 7-t of byte 0.
  EXPECT_EQ(GlobalStateWithHosts(tier, {a, b}),
            "tailcut-global-state 1 10 1 4 7 8 16 1\n" + files + std::string(1, '\xf1'));
  auto refusal = [&](const std::vector<std::string>& hosts) -> std::string {
    try {
      GlobalStateWithHosts(tier, hosts);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(refusal({a, HostState(8, 1, 8)}),
            "host state 1 is of another job than the tier's state (items, epochs, seed or files "
            "differ): pass WorkQueue::SaveHostState() of each host of this job");
  EXPECT_EQ(refusal({HostState(10, 1 << 9)}),
            "host state 0 has ticket 9 done, which the tier's state has not handed out (cursor "
            "8): save the tier's state after every host's");
}

TEST(GlobalTierErrorTest, AnotherConfigurationFromAnotherHostNamesTheField) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  auto a = GlobalTier::Open(Options(redis.url(), "a"));
  GlobalTierOptions b = Options(redis.url(), "b");
  b.job.files_fingerprint = "files-v2";
  try {
    GlobalTier::Open(b);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfigMismatch);
    EXPECT_EQ(std::string(e.what()),
              "global job 'job': files_fingerprint is files-v1 in the job on " + redis.url() +
                  " but files-v2 on this host: every host must use the same configuration (or "
                  "another job name)");
  }
  GlobalTierOptions c = Options(redis.url(), "c", 11);
  try {
    GlobalTier::Open(c);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_items is 10 in the job"), std::string::npos)
        << e.what();
  }
}

TEST(GlobalTierErrorTest, AWrongPasswordIsNamedWithoutThePassword) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis({"--requirepass", "right-one"});
  const std::string host_port = "127.0.0.1:" + std::to_string(redis.port());
  GlobalTierOptions options = Options("redis://:wrong-one@" + host_port + "/0", "a");
  try {
    GlobalTier::Open(options);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kPermission);
    EXPECT_EQ(std::string(e.what()),
              "Redis at redis://" + host_port +
                  "/0 refused user 'default' (WRONGPASS invalid username-password pair or user "
                  "is disabled.): set the right password in TAILCUT_REDIS_PASSWORD or the URL");
    EXPECT_EQ(std::string(e.what()).find("wrong-one"), std::string::npos);
  }
  // No password at all: the first command is refused.
  try {
    GlobalTier::Open(Options("redis://" + host_port + "/0", "a"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kPermission);
    EXPECT_EQ(std::string(e.what()),
              "Redis at redis://" + host_port +
                  "/0 refused user 'default' (NOAUTH Authentication required.): set the right "
                  "password in TAILCUT_REDIS_PASSWORD or the URL");
  }
  // The right one, from the environment.
  setenv("TAILCUT_REDIS_PASSWORD", "right-one", 1);
  EXPECT_NO_THROW(GlobalTier::Open(Options("redis://" + host_port + "/0", "a")));
  unsetenv("TAILCUT_REDIS_PASSWORD");
}

TEST(GlobalTierErrorTest, AnAclUserLogsIn) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis({"--user", "feeder", "on", ">pw-of-feeder", "~tailcut:*", "+@all"});
  const std::string host_port = "127.0.0.1:" + std::to_string(redis.port());
  auto tier = GlobalTier::Open(Options("redis://feeder:pw-of-feeder@" + host_port + "/0", "a"));
  GlobalBlock block;
  EXPECT_EQ(tier->Claim(milliseconds(60000), &block), GlobalClaimStatus::kOk);
  EXPECT_EQ(tier->Stats().coordinator, "redis://feeder@" + host_port + "/0");
  try {
    GlobalTier::Open(Options("redis://feeder:nope@" + host_port + "/0", "b"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kPermission);
    EXPECT_NE(std::string(e.what()).find("refused user 'feeder'"), std::string::npos);
    EXPECT_EQ(std::string(e.what()).find("nope"), std::string::npos);
  }
}

TEST(GlobalTierErrorTest, RedisDownAtStartIsNamedAfterBoundedRetries) {
  const int port = testing::FreePort();
  GlobalTierOptions options =
      Options("redis://u:secret-pw@127.0.0.1:" + std::to_string(port) + "/3", "a");
  options.retry_for = milliseconds(500);
  std::vector<std::string> notices;
  options.on_notice = [&](const std::string& line) { notices.push_back(line); };
  auto start = std::chrono::steady_clock::now();
  try {
    GlobalTier::Open(options);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_EQ(std::string(e.what()),
              "cannot reach Redis at redis://u@127.0.0.1:" + std::to_string(port) +
                  "/3 for 500 ms (Connection refused): start redis-server there or point "
                  "TAILCUT_COORDINATOR at one that runs");
  }
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, milliseconds(300));
  EXPECT_LT(took, milliseconds(1500));
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0], "Redis at redis://u@127.0.0.1:" + std::to_string(port) +
                            "/3: Connection refused; reconnecting for up to 500 ms");
}

TEST(GlobalTierErrorTest, AHungRedisTimesOutEveryCommandAndIsUsedAgainWhenBack) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  GlobalTierOptions options = Options(redis.url(), "a");
  options.command_timeout = milliseconds(200);
  options.retry_for = milliseconds(800);
  auto tier = GlobalTier::Open(options);
  kill(redis.pid(), SIGSTOP);
  auto start = std::chrono::steady_clock::now();
  try {
    tier->Stats();
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_EQ(std::string(e.what()),
              "cannot reach Redis at " + redis.url() +
                  " for 800 ms (Resource temporarily unavailable): start redis-server there or "
                  "point TAILCUT_COORDINATOR at one that runs");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(2500));
  kill(redis.pid(), SIGCONT);
  GlobalBlock block;
  EXPECT_EQ(tier->Claim(milliseconds(60000), &block), GlobalClaimStatus::kOk);
}

// Losing the job's state: every call of a host that joined it says so, and
// names what was lost; Redis merely unreachable is not a loss (see
// AHungRedisTimesOutEveryCommandAndIsUsedAgainWhenBack above).
TEST(GlobalTierLossTest, AJobWhoseKeysAreGoneIsLostForEveryHostAndForHostsOpeningItLater) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  auto a = GlobalTier::Open(Options(redis.url(), "a"));
  auto b = GlobalTier::Open(Options(redis.url(), "b"));
  GlobalBlock block;
  ASSERT_EQ(a->Claim(milliseconds(60000), &block), GlobalClaimStatus::kOk);
  std::vector<uint64_t> first = {0};
  ASSERT_EQ(a->Ack(block, first), GlobalAckStatus::kOk);
  const std::string state = a->SaveState();
  RedisCli(redis, "FLUSHALL");  // what a restart without persistence leaves
  const std::string message =
      "the coordinator " + redis.url() +
      " lost job 'job' (its keys are gone: Redis restarted without persistence, or they were "
      "deleted); restart the job from a checkpoint (restore_state), and enable appendonly on "
      "that Redis; to start it over from the beginning instead, delete the key "
      "tailcut:{job}:lost there";
  EXPECT_EQ(a->loss(), GlobalLoss::kNone);
  EXPECT_EQ(a->Renew(block, milliseconds(60000)), GlobalAckStatus::kLost);
  EXPECT_EQ(a->loss(), GlobalLoss::kGone);
  EXPECT_EQ(a->Ack(block, block.tickets), GlobalAckStatus::kLost);
  EXPECT_EQ(a->Claim(milliseconds(60000), &block), GlobalClaimStatus::kLost);
  EXPECT_EQ(GlobalLossMessage(a->loss(), "job", redis.url()), message);
  try {
    a->SaveState();
    FAIL() << "saved the state of a lost job";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
    EXPECT_EQ(std::string(e.what()), message);
  }
  // A host that joined before and asks only now.
  EXPECT_EQ(b->Claim(milliseconds(60000), &block), GlobalClaimStatus::kLost);
  EXPECT_EQ(b->loss(), GlobalLoss::kGone);
  // A host that opens the job after the loss is refused, not handed a new
  // job from its first ticket.
  try {
    GlobalTier::Open(Options(redis.url(), "c"));
    FAIL() << "a host opened a lost job as a new one";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
    EXPECT_EQ(std::string(e.what()), message);
  }
  // Restarting from the checkpoint creates it again: a new run.
  GlobalTierOptions restart = Options(redis.url(), "c");
  restart.restore_state = state;
  auto c = GlobalTier::Open(restart);
  EXPECT_NE(c->run_id(), a->run_id());
  EXPECT_EQ(c->Stats().done, 1u);
  // The hosts of the run before stay fenced out of the new run.
  GlobalAckStatus late = a->Ack(block, first);
  EXPECT_EQ(late, GlobalAckStatus::kLost);
}

TEST(GlobalTierLossTest, AJobCreatedAgainUnderItsNameRefusesTheHostsOfTheRunBefore) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  auto old_run = GlobalTier::Open(Options(redis.url(), "a"));
  GlobalBlock held;
  ASSERT_EQ(old_run->Claim(milliseconds(60000), &held), GlobalClaimStatus::kOk);
  // The job's keys deleted while host a was paused, and the job started
  // over under the same name: its first block has generation 1 again.
  RedisCli(redis,
           "DEL tailcut:{job}:config tailcut:{job}:cursor tailcut:{job}:gen "
           "tailcut:{job}:deadline tailcut:{job}:owner tailcut:{job}:left");
  auto new_run = GlobalTier::Open(Options(redis.url(), "b"));
  GlobalBlock fresh;
  ASSERT_EQ(new_run->Claim(milliseconds(60000), &fresh), GlobalClaimStatus::kOk);
  ASSERT_EQ(fresh.first, held.first);
  ASSERT_EQ(fresh.generation, held.generation);
  // Host a comes back: its ack must not mark tickets of the new run done.
  EXPECT_EQ(old_run->Ack(held, held.tickets), GlobalAckStatus::kLost);
  EXPECT_EQ(old_run->loss(), GlobalLoss::kReplaced);
  EXPECT_EQ(new_run->Stats().done, 0u);
  EXPECT_EQ(GlobalLossMessage(GlobalLoss::kReplaced, "job", redis.url()),
            "job 'job' on the coordinator " + redis.url() +
                " is another run now (its keys were deleted and the job created again, e.g. "
                "restarted from a checkpoint under the same name): this process belongs to the "
                "run before and must stop");
}

TEST(GlobalTierLossTest, AJobMissingOnlyItsCursorDoneMarksGenerationsOrOpenBlocksIsLost) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  auto tier_for = [&](const std::string& name) {
    GlobalTierOptions options = Options(redis.url(), "a");
    options.job.name = name;
    return GlobalTier::Open(options);
  };
  GlobalBlock block;
  std::vector<uint64_t> one = {0};
  {
    auto tier = tier_for("cursor");
    ASSERT_EQ(tier->Claim(milliseconds(60000), &block), GlobalClaimStatus::kOk);
    RedisCli(redis, "DEL tailcut:{cursor}:cursor");
    EXPECT_EQ(tier->Claim(milliseconds(60000), &block), GlobalClaimStatus::kLost);
    EXPECT_EQ(tier->loss(), GlobalLoss::kCursor);
  }
  {
    auto tier = tier_for("done");
    ASSERT_EQ(tier->Claim(milliseconds(60000), &block), GlobalClaimStatus::kOk);
    ASSERT_EQ(tier->Ack(block, one), GlobalAckStatus::kOk);
    RedisCli(redis, "DEL tailcut:{done}:done");
    EXPECT_EQ(tier->Renew(block, milliseconds(60000)), GlobalAckStatus::kLost);
    EXPECT_EQ(tier->loss(), GlobalLoss::kDoneMarks);
  }
  {
    auto tier = tier_for("gen");
    ASSERT_EQ(tier->Claim(milliseconds(60000), &block), GlobalClaimStatus::kOk);
    RedisCli(redis, "DEL tailcut:{gen}:gen");
    EXPECT_EQ(tier->Renew(block, milliseconds(60000)), GlobalAckStatus::kLost);
    EXPECT_EQ(tier->loss(), GlobalLoss::kGenerations);
  }
  {
    // Every block handed out, then the set of open blocks deleted: nothing
    // can finish the job.
    auto tier = tier_for("blocks");
    for (int i = 0; i < 3; ++i)
      ASSERT_EQ(tier->Claim(milliseconds(60000), &block), GlobalClaimStatus::kOk);
    RedisCli(redis, "DEL tailcut:{blocks}:deadline");
    EXPECT_EQ(tier->Claim(milliseconds(60000), &block), GlobalClaimStatus::kLost);
    EXPECT_EQ(tier->loss(), GlobalLoss::kOpenBlocks);
  }
  EXPECT_EQ(GlobalLossMessage(GlobalLoss::kCursor, "cursor", redis.url()),
            "the coordinator " + redis.url() +
                " lost part of job 'cursor' (its cursor key is gone: deleted, or evicted under "
                "maxmemory); restart the job from a checkpoint (restore_state), and set "
                "maxmemory-policy noeviction on that Redis");
}

}  // namespace
}  // namespace tailcut
