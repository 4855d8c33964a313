// WorkQueue with a coordinator, across real processes: simulated hosts (a
// host id each) of several forked processes, one redis-server of the test's
// own. Every process takes, reads and acks items through the ordinary
// WorkQueue API and logs each ack; the parent checks the logs against every
// (epoch, item) of the job: exactly once with all hosts alive and through a
// Redis crash, and nothing lost, nothing doubled by the survivors when a
// whole host is killed or paused past its TTL; and each host's settled tickets
// (WorkQueue::SettledTickets) reach the end once its share is done, while
// another host still holds the last blocks.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "global/redis_server.h"
#include "tailcut/global_tier.h"
#include "tailcut/work_queue.h"

namespace tailcut {
namespace {

using std::chrono::milliseconds;
using testing::RedisServer;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kFiles = 6;
constexpr uint64_t kSlices = 240;
constexpr uint64_t kEpochs = 3;

class Dir {
 public:
  Dir() {
    char tmpl[] = "/tmp/tailcut-coord-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~Dir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string UniqueJob(const char* tag) {
  static int n = 0;
  return "tccoord_" + std::to_string(getpid()) + "_" + std::to_string(n++) + "_" + tag;
}

struct Job {
  std::string url;
  std::string name;
  std::vector<std::string> works;
  milliseconds ttl{1500};
  milliseconds work_per_item{2};
  std::string restore_state;  // a GlobalTier::SaveState() to create the job from
  std::optional<uint64_t> seed;
};

WorkQueueOptions Options(const Job& job, const std::string& host, int processes) {
  WorkQueueOptions o;
  o.name = job.name;
  o.works = job.works;
  o.num_epochs = kEpochs;
  o.num_slices = kSlices;
  o.num_clients = static_cast<uint32_t>(processes);
  o.shuffle = true;
  o.coordinator = job.url;
  o.host_id = host;
  o.global_ttl = job.ttl;
  o.global_block_size = 4;
  o.restore_state = job.restore_state;
  o.seed = job.seed;
  o.on_notice = [](const std::string&) {};
  return o;
}

// Exit status of a process whose take answered kJobLost; it wrote
// JobLossMessage() to its log + ".lost".
constexpr int kExitJobLost = 5;

// One process of a host: takes until the end, logs (epoch * items + index)
// of every item it acked. Returns its exit status. With `hold_until`, it
// holds its first item, says so (`hold_until` + ".holding") and acks it only
// once that file exists.
int RunProcess(const Job& job, const std::string& host, int processes, const std::string& log,
               const std::string& hold_until = "") {
  std::unique_ptr<WorkQueue> q;
  try {
    q = WorkQueue::Open(Options(job, host, processes));
  } catch (const Error& e) {
    fprintf(stderr, "%s: %s\n", host.c_str(), e.what());
    return 2;
  }
  int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  WorkItem item;
  int held_first = 0;
  for (;;) {
    TakeStatus st = q->Take(&item, Clock::now() + std::chrono::seconds(60));
    if (st == TakeStatus::kEnd) break;
    if (st == TakeStatus::kJobLost) {
      std::ofstream(log + ".lost") << q->JobLossMessage();
      q->Close();
      return kExitJobLost;
    }
    if (st != TakeStatus::kOk) {
      fprintf(stderr, "%s: take returned %d\n", host.c_str(), static_cast<int>(st));
      return 3;
    }
    std::this_thread::sleep_for(job.work_per_item);
    if (!hold_until.empty() && held_first++ == 0) {
      std::ofstream(hold_until + ".holding") << "\n";
      auto give_up = Clock::now() + std::chrono::seconds(60);
      while (!std::filesystem::exists(hold_until) && Clock::now() < give_up)
        std::this_thread::sleep_for(milliseconds(5));
    }
    if (q->Ack(item) == ItemStatus::kOk) {
      uint64_t key = item.epoch * q->num_items() + item.index;
      if (write(fd, &key, sizeof(key)) != sizeof(key)) return 4;
    }
  }
  close(fd);
  q->Close();
  return 0;
}

struct Host {
  std::string id;
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
};

// `processes` forked processes of host `id`; `tag` tells their logs apart
// from those of other processes of the same host started separately.
Host StartHost(const Job& job, const std::string& id, int processes, const std::string& dir,
               const std::string& tag = "") {
  Host h;
  h.id = id;
  for (int p = 0; p < processes; ++p) {
    std::string log = dir + "/" + id + tag + "." + std::to_string(p) + ".log";
    h.logs.push_back(log);
    pid_t pid = fork();
    if (pid == 0) _exit(RunProcess(job, id, processes, log));
    h.pids.push_back(pid);
  }
  return h;
}

std::vector<int> Wait(const Host& h) {
  std::vector<int> codes;
  for (pid_t pid : h.pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return codes;
}

// How many times each key was acked, over the given hosts' logs.
std::map<uint64_t, int> Counts(const std::vector<Host>& hosts) {
  std::map<uint64_t, int> counts;
  for (const Host& h : hosts)
    for (const std::string& log : h.logs) {
      std::ifstream in(log, std::ios::binary);
      uint64_t key;
      while (in.read(reinterpret_cast<char*>(&key), sizeof(key))) ++counts[key];
    }
  return counts;
}

uint64_t NumItems(const Job& job) {
  WorkQueueOptions o = Options(job, "probe", 1);
  o.coordinator.clear();
  o.name = job.name + "_probe";
  auto q = WorkQueue::Open(o);
  uint64_t n = q->num_items();
  q->Close();  // unfinished and closed by all: removed
  return n;
}

// The job as Redis sees it.
GlobalStats JobStats(const Job& job) {
  GlobalTierOptions o;
  o.coordinator = job.url;
  o.job.name = job.name;
  o.on_notice = [](const std::string&) {};
  return GlobalTier::Inspect(o);
}

// Runs redis-cli with `args` against the test's server; returns its output.
std::string RedisCli(int port, const std::string& args) {
  std::string command = "redis-cli -p " + std::to_string(port) + " " + args;
  std::string out;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    char buf[256];
    while (fgets(buf, sizeof(buf), pipe) != nullptr) out += buf;
    pclose(pipe);
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// The job's state now (GlobalTier::SaveState), from a tier that joins it
// with the configuration Redis holds and claims nothing.
std::string SaveJobState(const Job& job, int port) {
  const std::string config = "HGET tailcut:{" + job.name + "}:config ";
  GlobalTierOptions o;
  o.coordinator = job.url;
  o.host_id = "checkpoint";
  o.job.name = job.name;
  o.job.num_items = std::stoull(RedisCli(port, config + "items"));
  o.job.num_epochs = std::stoull(RedisCli(port, config + "epochs"));
  o.job.block_size = std::stoull(RedisCli(port, config + "block"));
  o.job.files_fingerprint = RedisCli(port, config + "files");
  o.job.seed_explicit = false;
  o.on_notice = [](const std::string&) {};
  return GlobalTier::Open(o)->SaveState();
}

// Every process of `hosts` stopped on kJobLost and wrote `message`.
void ExpectEveryProcessSaid(const std::vector<Host>& hosts, const std::string& message) {
  for (const Host& h : hosts)
    for (const std::string& log : h.logs) {
      std::ifstream in(log + ".lost");
      std::string said((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      EXPECT_EQ(said, message) << log;
    }
}

// Stops every process of `host` (SIGSTOP) at a moment when it holds a block
// with tickets left in Redis, so that its fault must be seen by the others:
// between its acks and its next claim a host may briefly hold none.
// Returns false if that moment never came.
bool StopWhileHoldingABlock(const Job& job, const Host& host) {
  auto give_up = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < give_up) {
    for (pid_t pid : host.pids) kill(pid, SIGSTOP);
    for (const GlobalOpenBlock& b : JobStats(job).open_blocks)
      if (b.host_id == host.id && b.left > 0) return true;
    for (pid_t pid : host.pids) kill(pid, SIGCONT);
    std::this_thread::sleep_for(milliseconds(3));
  }
  return false;
}

std::string Missing(const std::map<uint64_t, int>& counts, uint64_t total) {
  std::string out;
  int shown = 0;
  for (uint64_t k = 0; k < total; ++k)
    if (!counts.count(k) && shown++ < 5) out += std::to_string(k) + " ";
  return out;
}

class CoordinatedQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (uint64_t f = 0; f < kFiles; ++f) {
      std::string path = dir_.path() + "/part-" + std::to_string(f);
      std::ofstream(path) << std::string(4096 * (f + 3), 'x');
      job_.works.push_back(path);
    }
  }
  void TearDown() override {
    for (const std::string& h : {"a", "b", "c", "probe"}) {
      try {
        RemoveQueue(job_.name + "." + h, true);
      } catch (const Error&) {
      }
    }
  }
  Dir dir_;
  Job job_;
};

TEST_F(CoordinatedQueueTest, ThreeHostsOfThreeProcessesUseEveryItemOncePerEpoch) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  job_.url = redis.url();
  job_.name = UniqueJob("once");
  const uint64_t total = NumItems(job_) * kEpochs;
  std::vector<Host> hosts;
  for (const char* id : {"a", "b", "c"}) hosts.push_back(StartHost(job_, id, 3, dir_.path()));
  for (const Host& h : hosts)
    for (int code : Wait(h)) EXPECT_EQ(code, 0) << "host " << h.id;
  std::map<uint64_t, int> counts = Counts(hosts);
  EXPECT_EQ(counts.size(), total) << "missing, e.g.: " << Missing(counts, total);
  for (const auto& [key, n] : counts) EXPECT_EQ(n, 1) << "item key " << key;
  // Every host took part, and Redis agrees that every ticket is done.
  for (const Host& h : hosts) EXPECT_GT(Counts({h}).size(), 0u) << "host " << h.id;
  EXPECT_EQ(JobStats(job_).done, total);
  // Every host's queue removed itself at the end.
  for (const Host& h : hosts)
    EXPECT_FALSE(std::filesystem::exists(SegmentPath(job_.name + "." + h.id)));
}

TEST_F(CoordinatedQueueTest, AHostKilledMidEpochLosesNothingAndTheOthersDoubleNothing) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  job_.url = redis.url();
  job_.name = UniqueJob("kill");
  job_.ttl = milliseconds(1000);
  job_.work_per_item = milliseconds(5);
  const uint64_t total = NumItems(job_) * kEpochs;
  std::vector<Host> hosts;
  for (const char* id : {"a", "b", "c"}) hosts.push_back(StartHost(job_, id, 3, dir_.path()));
  // Let host c work for a while, then kill every process of it at once.
  auto give_up = Clock::now() + std::chrono::seconds(20);
  while (Counts({hosts[2]}).size() < 30 && Clock::now() < give_up)
    std::this_thread::sleep_for(milliseconds(5));
  ASSERT_TRUE(StopWhileHoldingABlock(job_, hosts[2])) << "host c never held a block";
  ASSERT_LT(Counts(hosts).size(), total * 2 / 3) << "the job ended before the kill";
  for (pid_t pid : hosts[2].pids) kill(pid, SIGKILL);
  Wait(hosts[2]);
  for (int i = 0; i < 2; ++i)
    for (int code : Wait(hosts[i])) EXPECT_EQ(code, 0) << "host " << hosts[i].id;
  std::map<uint64_t, int> survivors = Counts({hosts[0], hosts[1]});
  std::map<uint64_t, int> all = Counts(hosts);
  EXPECT_EQ(all.size(), total) << "lost, e.g.: " << Missing(all, total);
  for (const auto& [key, n] : survivors) EXPECT_EQ(n, 1) << "item key " << key;
  EXPECT_GT(Counts({hosts[2]}).size(), 0u);
  // The dead host's blocks expired and were re-owned; Redis counts each ticket once.
  GlobalStats stats = JobStats(job_);
  EXPECT_EQ(stats.done, total);
  uint64_t reclaims = 0;
  for (const GlobalHostStats& h : stats.hosts) reclaims += h.reclaims;
  EXPECT_GT(reclaims, 0u) << "nobody re-owned the dead host's blocks";
}

TEST_F(CoordinatedQueueTest, WhenAHostsFeederDiesAnotherProcessOfTheHostTakesOver) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  job_.url = redis.url();
  job_.name = UniqueJob("feeder");
  job_.ttl = milliseconds(1500);
  job_.work_per_item = milliseconds(5);
  const uint64_t total = NumItems(job_) * kEpochs;
  // Host a's first process opens alone, so its feeder thread leads; the
  // second joins once the first has acked items.
  Host first = StartHost(job_, "a", 1, dir_.path());
  auto give_up = Clock::now() + std::chrono::seconds(20);
  while (Counts({first}).size() < 10 && Clock::now() < give_up)
    std::this_thread::sleep_for(milliseconds(5));
  Host second = StartHost(job_, "a", 1, dir_.path(), "-second");
  Host other = StartHost(job_, "b", 2, dir_.path());
  std::this_thread::sleep_for(milliseconds(200));
  ASSERT_LT(Counts({first, second, other}).size(), total * 2 / 3) << "the job ended too soon";
  kill(first.pids[0], SIGKILL);  // the feeder of host a
  Wait(first);
  for (int code : Wait(second)) EXPECT_EQ(code, 0) << "host a's second process";
  for (int code : Wait(other)) EXPECT_EQ(code, 0) << "host b";
  std::map<uint64_t, int> all = Counts({first, second, other});
  EXPECT_EQ(all.size(), total) << "lost, e.g.: " << Missing(all, total);
  for (const auto& [key, n] : Counts({second, other})) EXPECT_EQ(n, 1) << "key " << key;
  EXPECT_GT(Counts({second}).size(), 0u) << "host a's survivor never got items";
}

// Takes and acks until no item comes within `wait` (or the end). Returns how many.
uint64_t TakeAndAckWhileItemsCome(WorkQueue& q, milliseconds wait) {
  uint64_t n = 0;
  WorkItem item;
  while (q.Take(&item, Clock::now() + wait) == TakeStatus::kOk) n += q.Ack(item) == ItemStatus::kOk;
  return n;
}

// Takes and acks until it acked a ticket at or past `ticket`; so the host
// holds a few blocks ahead, no more (its feeder claims as its takers take).
uint64_t TakeAndAckUpTo(WorkQueue& q, uint64_t ticket) {
  uint64_t n = 0;
  WorkItem item;
  while (q.Take(&item, Clock::now() + std::chrono::seconds(10)) == TakeStatus::kOk) {
    n += q.Ack(item) == ItemStatus::kOk;
    if (item.ticket >= ticket) break;
  }
  return n;
}

// How many tickets before the end host a stops, so that host b claims the
// job's last blocks (a host claims two blocks of 4 ahead of its takers).
constexpr uint64_t kLeftForB = 60;

TEST_F(CoordinatedQueueTest,
       AHostsSettledTicketsReachTheEndOnceItsShareIsDoneThoughAnotherHostHoldsTheLastBlocks) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  job_.url = redis.url();
  job_.name = UniqueJob("settled");
  auto a = WorkQueue::Open(Options(job_, "a", 1));
  const uint64_t n = a->num_items(), total = n * kEpochs;
  uint64_t done_by_a = TakeAndAckUpTo(*a, total - kLeftForB);
  EXPECT_GE(a->SettledTickets(), 2 * n) << "host a alone: its first epochs are settled";
  // Host b holds one item and does the rest of the job but the blocks host a
  // claimed ahead: b claimed the last ones, a's limit stops below the end.
  auto b = WorkQueue::Open(Options(job_, "b", 1));
  WorkItem held;
  ASSERT_EQ(b->Take(&held, Clock::now() + std::chrono::seconds(10)), TakeStatus::kOk);
  uint64_t done_by_b = TakeAndAckWhileItemsCome(*b, milliseconds(1000));
  done_by_a += TakeAndAckWhileItemsCome(*a, milliseconds(1000));
  // Every block is handed out, the rest is b's: a's share is settled to the
  // end, from any start, while b's is not (the ticket it holds).
  EXPECT_EQ(a->SettledTickets(), total);
  EXPECT_EQ(a->SettledTickets(n), total);
  EXPECT_LE(b->SettledTickets(), held.ticket);
  ASSERT_EQ(b->Ack(held), ItemStatus::kOk);
  WorkItem item;
  EXPECT_EQ(b->Take(&item, Clock::now() + std::chrono::seconds(10)), TakeStatus::kEnd);
  EXPECT_EQ(done_by_a + done_by_b + 1, total);
  EXPECT_EQ(b->SettledTickets(), total);
  EXPECT_EQ(a->Take(&item, Clock::now() + std::chrono::seconds(10)), TakeStatus::kEnd);
  a->Close();
  b->Close();
}

// Writes `text` to `path` at once (a temporary file renamed over it): a
// reader that waits for the file to exist (AwaitFile) never finds it empty.
void WriteFileAtOnce(const std::string& path, const std::string& text) {
  std::ofstream(path + ".tmp") << text;
  std::filesystem::rename(path + ".tmp", path);
}

void AwaitFile(const std::string& path) {
  auto give_up = Clock::now() + std::chrono::seconds(60);
  while (!std::filesystem::exists(path) && Clock::now() < give_up)
    std::this_thread::sleep_for(milliseconds(5));
}

// A process of host a (2 processes): acks up to kLeftForB tickets before the
// end, says so (`dir`/a.<p>.paused) and waits for `dir`/go; then acks while
// items come, waits (bounded) for its host's settled tickets, which the
// feeder thread of whichever process leads moves, to reach the end, writes
// them to `dir`/a.<p>.settled and takes until the end.
int PauseThenFinishShare(const Job& job, const std::string& dir, int p) {
  auto q = WorkQueue::Open(Options(job, "a", 2));
  const uint64_t total = q->num_items() * kEpochs;
  TakeAndAckUpTo(*q, total - kLeftForB);
  std::ofstream(dir + "/a." + std::to_string(p) + ".paused") << "\n";
  AwaitFile(dir + "/go");
  TakeAndAckWhileItemsCome(*q, milliseconds(1000));
  auto give_up = Clock::now() + std::chrono::seconds(20);
  while (q->SettledTickets() < total && Clock::now() < give_up)
    std::this_thread::sleep_for(milliseconds(5));
  WriteFileAtOnce(dir + "/a." + std::to_string(p) + ".settled",
                  std::to_string(q->SettledTickets()) + "\n");
  WorkItem item;
  TakeStatus end = q->Take(&item, Clock::now() + std::chrono::seconds(60));
  q->Close();
  return end == TakeStatus::kEnd ? 0 : 2;
}

// The process of host b: holds one item, acks the rest while items come,
// says so (`dir`/b.idle) and waits for `dir`/release; checks that its
// host's settled tickets are still below the item; acks it; ends.
int HoldOneAndDoTheRest(const Job& job, const std::string& dir) {
  auto q = WorkQueue::Open(Options(job, "b", 1));
  WorkItem held;
  if (q->Take(&held, Clock::now() + std::chrono::seconds(30)) != TakeStatus::kOk) return 2;
  TakeAndAckWhileItemsCome(*q, milliseconds(1000));
  std::ofstream(dir + "/b.idle") << "\n";
  AwaitFile(dir + "/release");
  if (q->SettledTickets() > held.ticket) return 3;
  if (q->Ack(held) != ItemStatus::kOk) return 4;
  TakeAndAckWhileItemsCome(*q, milliseconds(30000));
  if (q->SettledTickets() != q->num_items() * kEpochs) return 5;
  q->Close();
  return 0;
}

int ExitCode(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST_F(CoordinatedQueueTest, EveryProcessOfAHostSeesItsShareSettledBeforeAnotherHostFinishes) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  job_.url = redis.url();
  job_.name = UniqueJob("settledproc");
  const uint64_t total = NumItems(job_) * kEpochs;
  const std::string& dir = dir_.path();
  std::vector<pid_t> a;
  for (int p = 0; p < 2; ++p) {
    pid_t pid = fork();
    if (pid == 0) _exit(PauseThenFinishShare(job_, dir, p));
    a.push_back(pid);
  }
  AwaitFile(dir + "/a.0.paused");
  AwaitFile(dir + "/a.1.paused");
  pid_t b = fork();
  if (b == 0) _exit(HoldOneAndDoTheRest(job_, dir));
  AwaitFile(dir + "/b.idle");
  std::ofstream(dir + "/go") << "\n";
  AwaitFile(dir + "/a.0.settled");
  AwaitFile(dir + "/a.1.settled");
  // Both processes of host a saw the end while host b still held its item.
  for (int p = 0; p < 2; ++p) {
    uint64_t settled = 0;
    std::ifstream(dir + "/a." + std::to_string(p) + ".settled") >> settled;
    EXPECT_EQ(settled, total) << "process " << p << " of host a";
  }
  std::ofstream(dir + "/release") << "\n";
  for (pid_t pid : a) EXPECT_EQ(ExitCode(pid), 0) << "host a";
  EXPECT_EQ(ExitCode(b), 0) << "host b";
  EXPECT_EQ(JobStats(job_).done, total);
}

TEST_F(CoordinatedQueueTest, AHostPausedPastItsTtlIsFencedAndTheJobEndsExactlyOnceInRedis) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  job_.url = redis.url();
  job_.name = UniqueJob("pause");
  job_.ttl = milliseconds(600);
  job_.work_per_item = milliseconds(3);
  const uint64_t total = NumItems(job_) * kEpochs;
  std::vector<Host> hosts;
  for (const char* id : {"a", "b", "c"}) hosts.push_back(StartHost(job_, id, 2, dir_.path()));
  auto give_up = Clock::now() + std::chrono::seconds(20);
  while (Counts({hosts[2]}).size() < 20 && Clock::now() < give_up)
    std::this_thread::sleep_for(milliseconds(5));
  ASSERT_TRUE(StopWhileHoldingABlock(job_, hosts[2])) << "host c never held a block";
  ASSERT_LT(Counts(hosts).size(), total * 2 / 3) << "the job ended before the pause";
  std::this_thread::sleep_for(job_.ttl * 4);  // its blocks expire and go to a and b
  for (pid_t pid : hosts[2].pids) kill(pid, SIGCONT);
  for (const Host& h : hosts)
    for (int code : Wait(h)) EXPECT_EQ(code, 0) << "host " << h.id;
  std::map<uint64_t, int> all = Counts(hosts);
  EXPECT_EQ(all.size(), total) << "lost, e.g.: " << Missing(all, total);
  for (const auto& [key, n] : Counts({hosts[0], hosts[1]})) EXPECT_EQ(n, 1) << "key " << key;
  GlobalStats stats = JobStats(job_);
  EXPECT_EQ(stats.done, total);
  uint64_t refused = 0, reclaims = 0;
  for (const GlobalHostStats& h : stats.hosts) {
    if (h.host_id == "c") refused = h.stale_acks + h.stale_renews;
    reclaims += h.reclaims;
  }
  EXPECT_GT(reclaims, 0u) << "nobody re-owned the paused host's blocks";
  EXPECT_GT(refused, 0u) << "the paused host was not fenced";
}

// Blocks re-owned after their deadline passed, over every host of the job.
uint64_t Reclaims(const Job& job) {
  uint64_t n = 0;
  for (const GlobalHostStats& h : JobStats(job).hosts) n += h.reclaims;
  return n;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// How long after `since` Redis counts a first re-owned block; nullopt if
// none within `bound`.
std::optional<Clock::duration> AwaitReclaim(const Job& job, Clock::time_point since,
                                            Clock::duration bound) {
  while (Clock::now() < since + bound) {
    if (Reclaims(job) > 0) return Clock::now() - since;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return std::nullopt;
}

// With the default global_ttl, a dead host costs the others seconds, not
// the minute it did with the TTL of 60 s (the survivors ended 60.2 s after
// the kill). Host c is SIGKILLed holding blocks; the others soon run out of
// other work and wait for them. The test prints the seconds from the kill to
// the first re-own of c's blocks and to the job's end (docs/global.md).
TEST_F(CoordinatedQueueTest, AHostKilledWithTheDefaultTtlHasItsBlocksReownedWithinTenSeconds) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  job_.url = redis.url();
  job_.name = UniqueJob("killdefault");
  job_.ttl = WorkQueueOptions().global_ttl;
  job_.work_per_item = milliseconds(5);
  const uint64_t total = NumItems(job_) * kEpochs;
  std::vector<Host> hosts;
  for (const char* id : {"a", "b", "c"}) hosts.push_back(StartHost(job_, id, 3, dir_.path()));
  auto give_up = Clock::now() + std::chrono::seconds(20);
  while (Counts({hosts[2]}).size() < 30 && Clock::now() < give_up)
    std::this_thread::sleep_for(milliseconds(5));
  ASSERT_TRUE(StopWhileHoldingABlock(job_, hosts[2])) << "host c never held a block";
  ASSERT_LT(Counts(hosts).size(), total * 2 / 3) << "the job ended before the kill";
  ASSERT_EQ(Reclaims(job_), 0u) << "a block was re-owned before any host failed";
  for (pid_t pid : hosts[2].pids) kill(pid, SIGKILL);
  const auto killed = Clock::now();
  Wait(hosts[2]);
  std::optional<Clock::duration> reowned = AwaitReclaim(job_, killed, std::chrono::seconds(30));
  for (int i = 0; i < 2; ++i)
    for (int code : Wait(hosts[i])) EXPECT_EQ(code, 0) << "host " << hosts[i].id;
  const Clock::duration ended = Clock::now() - killed;
  ASSERT_TRUE(reowned) << "nobody re-owned the dead host's blocks within 30 s";
  std::printf(
      "global_ttl %.1f s (default): host c's blocks re-owned %.2f s after the kill, "
      "the job ended %.2f s after it\n",
      Seconds(job_.ttl), Seconds(*reowned), Seconds(ended));
  EXPECT_LT(*reowned, std::chrono::seconds(10));
  std::map<uint64_t, int> all = Counts(hosts);
  EXPECT_EQ(all.size(), total) << "lost, e.g.: " << Missing(all, total);
  for (const auto& [key, n] : Counts({hosts[0], hosts[1]})) EXPECT_EQ(n, 1) << "item key " << key;
  EXPECT_EQ(JobStats(job_).done, total);
}

// A host with work enough claims nothing for a while; a dead host's blocks
// must come back to it once they expire all the same, not whenever it next
// runs short. Host a's one process holds its first item (its feeder holds
// three blocks ahead: enough) until the test has seen the re-own; host c is
// SIGKILLed holding blocks. Before the feeder looked for expired blocks
// between claims, a re-owned them only after it was released.
TEST_F(CoordinatedQueueTest, AHostWithWorkEnoughStillReownsADeadHostsBlocksWithinTenSeconds) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  job_.url = redis.url();
  job_.name = UniqueJob("busy");
  job_.ttl = WorkQueueOptions().global_ttl;
  job_.work_per_item = milliseconds(2);
  const uint64_t total = NumItems(job_) * kEpochs;
  const std::string release = dir_.path() + "/release";
  Host a;
  a.id = "a";
  a.logs = {dir_.path() + "/a.0.log"};
  pid_t pid = fork();
  if (pid == 0) _exit(RunProcess(job_, "a", 1, a.logs[0], release));
  a.pids = {pid};
  AwaitFile(release + ".holding");
  Host c = StartHost(job_, "c", 1, dir_.path());
  auto give_up = Clock::now() + std::chrono::seconds(20);
  while (Counts({c}).size() < 20 && Clock::now() < give_up)
    std::this_thread::sleep_for(milliseconds(5));
  ASSERT_TRUE(StopWhileHoldingABlock(job_, c)) << "host c never held a block";
  ASSERT_LT(Counts({a, c}).size(), total * 2 / 3) << "the job ended before the kill";
  ASSERT_EQ(Reclaims(job_), 0u) << "a block was re-owned before any host failed";
  kill(c.pids[0], SIGKILL);
  const auto killed = Clock::now();
  Wait(c);
  std::optional<Clock::duration> reowned = AwaitReclaim(job_, killed, std::chrono::seconds(20));
  std::ofstream(release) << "\n";
  for (int code : Wait(a)) EXPECT_EQ(code, 0) << "host a";
  ASSERT_TRUE(reowned) << "host a, holding work enough, did not re-own the dead host's blocks "
                          "within 20 s";
  std::printf("host a, busy, re-owned host c's blocks %.2f s after the kill\n", Seconds(*reowned));
  EXPECT_LT(*reowned, std::chrono::seconds(10));
  std::map<uint64_t, int> all = Counts({a, c});
  EXPECT_EQ(all.size(), total) << "lost, e.g.: " << Missing(all, total);
  for (const auto& [key, n] : Counts({a})) EXPECT_EQ(n, 1) << "item key " << key;
  EXPECT_EQ(JobStats(job_).done, total);
}

// A live host that only stalls (a GC, a loaded machine; here SIGSTOP of
// every process for 5 s) keeps its blocks with the default global_ttl: its
// heartbeat renewed them at most an eighth of the TTL before the stop and
// renews them as soon as it runs again. The others run out of other work
// meanwhile and ask for blocks every 50 ms, so an expired block would be
// re-owned at once.
TEST_F(CoordinatedQueueTest, AHostPausedFiveSecondsWithTheDefaultTtlIsNotFenced) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  job_.url = redis.url();
  job_.name = UniqueJob("stall");
  job_.ttl = WorkQueueOptions().global_ttl;
  job_.work_per_item = milliseconds(3);
  const uint64_t total = NumItems(job_) * kEpochs;
  std::vector<Host> hosts;
  for (const char* id : {"a", "b", "c"}) hosts.push_back(StartHost(job_, id, 2, dir_.path()));
  auto give_up = Clock::now() + std::chrono::seconds(20);
  while (Counts({hosts[2]}).size() < 20 && Clock::now() < give_up)
    std::this_thread::sleep_for(milliseconds(5));
  ASSERT_TRUE(StopWhileHoldingABlock(job_, hosts[2])) << "host c never held a block";
  ASSERT_LT(Counts(hosts).size(), total * 2 / 3) << "the job ended before the pause";
  std::this_thread::sleep_for(std::chrono::seconds(5));
  const size_t done_in_pause = Counts(hosts).size();
  for (pid_t pid : hosts[2].pids) kill(pid, SIGCONT);
  for (const Host& h : hosts)
    for (int code : Wait(h)) EXPECT_EQ(code, 0) << "host " << h.id;
  std::printf("after the 5 s pause of host c, %zu of %llu items were done\n", done_in_pause,
              static_cast<unsigned long long>(total));
  // Nobody fenced: every item read once over all hosts, nothing re-owned,
  // no renew or ack refused.
  std::map<uint64_t, int> all = Counts(hosts);
  EXPECT_EQ(all.size(), total) << "lost, e.g.: " << Missing(all, total);
  for (const auto& [key, n] : all) EXPECT_EQ(n, 1) << "item key " << key;
  GlobalStats stats = JobStats(job_);
  EXPECT_EQ(stats.done, total);
  for (const GlobalHostStats& h : stats.hosts) {
    EXPECT_EQ(h.reclaims, 0u) << "host " << h.host_id << " re-owned a block of the paused host";
    EXPECT_EQ(h.stale_acks + h.stale_renews, 0u) << "host " << h.host_id << " was fenced";
  }
}

TEST_F(CoordinatedQueueTest, RedisCrashingAndRestartingMidEpochKeepsExactlyOnce) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  job_.url = redis.url();
  job_.name = UniqueJob("redis");
  job_.ttl = milliseconds(6000);  // a Claim whose reply was lost comes back after it
  job_.work_per_item = milliseconds(5);
  const uint64_t total = NumItems(job_) * kEpochs;
  std::vector<Host> hosts;
  for (const char* id : {"a", "b"}) hosts.push_back(StartHost(job_, id, 2, dir_.path()));
  auto give_up = Clock::now() + std::chrono::seconds(20);
  while (Counts(hosts).size() < total / 3 && Clock::now() < give_up)
    std::this_thread::sleep_for(milliseconds(5));
  ASSERT_LT(Counts(hosts).size(), total * 2 / 3) << "the job ended before Redis crashed";
  redis.Kill();
  std::this_thread::sleep_for(milliseconds(300));
  redis.Start();  // from its append-only file
  for (const Host& h : hosts)
    for (int code : Wait(h)) EXPECT_EQ(code, 0) << "host " << h.id;
  std::map<uint64_t, int> counts = Counts(hosts);
  EXPECT_EQ(counts.size(), total) << "missing, e.g.: " << Missing(counts, total);
  for (const auto& [key, n] : counts) EXPECT_EQ(n, 1) << "item key " << key;
}

// Redis restarted without persistence mid-job: the job's keys are gone. Every
// process of every host must learn it from its take (not wait forever, not
// hear that other processes hold items), with the message; the hosts' queues
// go, and a host that opens the job afterwards is refused as well.
TEST_F(CoordinatedQueueTest, RedisRestartedWithoutItsDataMakesEveryProcessSayTheJobIsLost) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis({"--appendonly", "no"});
  job_.url = redis.url();
  job_.name = UniqueJob("lost");
  job_.ttl = milliseconds(1500);
  job_.work_per_item = milliseconds(5);
  const uint64_t total = NumItems(job_) * kEpochs;
  std::vector<Host> hosts;
  for (const char* id : {"a", "b"}) hosts.push_back(StartHost(job_, id, 2, dir_.path()));
  auto give_up = Clock::now() + std::chrono::seconds(20);
  while (Counts(hosts).size() < total / 4 && Clock::now() < give_up)
    std::this_thread::sleep_for(milliseconds(5));
  ASSERT_LT(Counts(hosts).size(), total * 2 / 3) << "the job ended before Redis restarted";
  redis.Kill();
  std::this_thread::sleep_for(milliseconds(300));
  redis.Start();  // empty: no append-only file, no snapshot
  const auto restarted = Clock::now();
  for (const Host& h : hosts)
    for (int code : Wait(h)) EXPECT_EQ(code, kExitJobLost) << "host " << h.id;
  const auto took = Clock::now() - restarted;
  std::printf("every process learnt of the loss within %lld ms of Redis restarting\n",
              static_cast<long long>(std::chrono::duration_cast<milliseconds>(took).count()));
  // The bound: the leading feeder asks Redis at least every global_ttl / 3
  // (renewals) and at once when its takers run dry; then every take sees it.
  EXPECT_LT(took, job_.ttl * 4) << "every process learnt of the loss only after "
                                << std::chrono::duration_cast<milliseconds>(took).count() << " ms";
  const std::string message =
      "the coordinator " + redis.url() + " lost job '" + job_.name +
      "' (its keys are gone: Redis restarted without persistence, or they were deleted); "
      "restart the job from a checkpoint (restore_state), and enable appendonly on that Redis; "
      "to start it over from the beginning instead, delete the key tailcut:{" +
      job_.name + "}:lost there";
  ExpectEveryProcessSaid(hosts, message);
  for (const Host& h : hosts)
    EXPECT_FALSE(std::filesystem::exists(SegmentPath(job_.name + "." + h.id))) << h.id;
  // A host that joins after the loss is refused before it creates anything.
  try {
    WorkQueue::Open(Options(job_, "c", 1));
    FAIL() << "host c opened the lost job as a new one";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
    EXPECT_EQ(std::string(e.what()), message);
  }
  EXPECT_FALSE(std::filesystem::exists(SegmentPath(job_.name + ".c")));
}

// One key of the job deleted mid-job (by hand, or evicted under maxmemory):
// the done marks. Every process must stop, saying which part was lost.
TEST_F(CoordinatedQueueTest, TheDoneMarksDeletedMidJobMakeEveryProcessSayPartOfTheJobIsLost) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  job_.url = redis.url();
  job_.name = UniqueJob("part");
  job_.work_per_item = milliseconds(5);
  const uint64_t total = NumItems(job_) * kEpochs;
  std::vector<Host> hosts;
  for (const char* id : {"a", "b"}) hosts.push_back(StartHost(job_, id, 2, dir_.path()));
  auto give_up = Clock::now() + std::chrono::seconds(20);
  while (Counts(hosts).size() < total / 4 && Clock::now() < give_up)
    std::this_thread::sleep_for(milliseconds(5));
  ASSERT_LT(Counts(hosts).size(), total * 2 / 3) << "the job ended before the deletion";
  RedisCli(redis.port(), "DEL tailcut:{" + job_.name + "}:done");
  for (const Host& h : hosts)
    for (int code : Wait(h)) EXPECT_EQ(code, kExitJobLost) << "host " << h.id;
  ExpectEveryProcessSaid(hosts, "the coordinator " + redis.url() + " lost part of job '" +
                                    job_.name +
                                    "' (its done marks are gone: deleted, or evicted under "
                                    "maxmemory); restart the job from a checkpoint "
                                    "(restore_state), and set maxmemory-policy noeviction on "
                                    "that Redis");
  for (const Host& h : hosts)
    EXPECT_FALSE(std::filesystem::exists(SegmentPath(job_.name + "." + h.id))) << h.id;
}

// The job restarted from a checkpoint under the same name (its keys deleted
// first) while a host of the run before was paused: when that host comes
// back it must stop, not feed its old queue from the new run.
TEST_F(CoordinatedQueueTest, AHostOfTheRunBeforeARestartUnderTheSameNameStopsWhenItComesBack) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  job_.url = redis.url();
  job_.name = UniqueJob("rerun");
  job_.ttl = milliseconds(1500);
  job_.work_per_item = milliseconds(5);
  const uint64_t total = NumItems(job_) * kEpochs;
  Host old_run = StartHost(job_, "a", 2, dir_.path());
  // Should an assertion end the test while host a is stopped: kill it.
  struct KillUnlessWaited {
    std::vector<pid_t> pids;
    ~KillUnlessWaited() {
      for (pid_t pid : pids) kill(pid, SIGKILL);
      for (pid_t pid : pids) waitpid(pid, nullptr, 0);
    }
  } guard{old_run.pids};
  auto give_up = Clock::now() + std::chrono::seconds(20);
  while (Counts({old_run}).size() < 30 && Clock::now() < give_up)
    std::this_thread::sleep_for(milliseconds(5));
  ASSERT_TRUE(StopWhileHoldingABlock(job_, old_run)) << "host a never held a block";
  ASSERT_LT(Counts({old_run}).size(), total * 2 / 3) << "the job ended before the pause";
  // The checkpoint, taken as any process of the job could (SaveState), then
  // every key of the job deleted, then the new run from the checkpoint.
  job_.restore_state = SaveJobState(job_, redis.port());
  RedisCli(redis.port(), "--scan --pattern 'tailcut:{" + job_.name + "}:*' | xargs redis-cli -p " +
                             std::to_string(redis.port()) + " del");
  Host new_run = StartHost(job_, "b", 2, dir_.path());
  for (int code : Wait(new_run)) EXPECT_EQ(code, 0) << "host b";
  EXPECT_EQ(JobStats(job_).done, total);
  // Host a comes back: it stops with the message, whatever it held.
  for (pid_t pid : old_run.pids) kill(pid, SIGCONT);
  guard.pids.clear();
  for (int code : Wait(old_run)) EXPECT_EQ(code, kExitJobLost) << "host a";
  const std::string message = "job '" + job_.name + "' on the coordinator " + redis.url() +
                              " is another run now (its keys were deleted and the job created "
                              "again, e.g. restarted from a checkpoint under the same name): this "
                              "process belongs to the run before and must stop";
  ExpectEveryProcessSaid({old_run}, message);
  // Nothing lost across the two runs, nothing twice in the new one, and the
  // new run's done marks are its own: Redis counts each ticket once.
  std::map<uint64_t, int> all = Counts({old_run, new_run});
  EXPECT_EQ(all.size(), total) << "lost, e.g.: " << Missing(all, total);
  for (const auto& [key, n] : Counts({new_run})) EXPECT_EQ(n, 1) << "key " << key;
  EXPECT_EQ(JobStats(job_).done, total);
  EXPECT_FALSE(std::filesystem::exists(SegmentPath(job_.name + ".a")));
}

// A host's queue kept after a crash (every process SIGKILLed) holds the done
// items of that run. If the job is then created again (keys deleted, same
// seed), a process of the new run must not resume that queue: it would skip
// the items done there and ack them to the new run unread (measured before:
// 687 of 720 items read, Redis counting 720 done).
// Takes from both hosts of one process until both answer kEnd; returns
// ticket -> (host, begin) of every item handed out, and counts repeats.
struct Handed {
  std::map<uint64_t, std::pair<std::string, uint64_t>> first;
  int repeats = 0;
};
// Host b alone first, until it has nothing more to take: every block goes to
// it, and host a's feeder, told the tier has nothing left, marks every ticket
// it was not given as another host's before a takes anything.
Handed DrainBoth(WorkQueue& a, WorkQueue& b) {
  Handed out;
  WorkItem item;
  while (b.Take(&item, Clock::now() + milliseconds(500)) == TakeStatus::kOk) {
    out.first.emplace(item.ticket, std::make_pair("b", item.begin));
    EXPECT_EQ(b.Ack(item), ItemStatus::kOk);
  }
  std::this_thread::sleep_for(milliseconds(300));
  bool ended[2] = {false, false};
  auto give_up = Clock::now() + std::chrono::seconds(60);
  while (!(ended[0] && ended[1]) && Clock::now() < give_up) {
    for (int h = 0; h < 2; ++h) {
      WorkQueue& q = h == 0 ? a : b;
      WorkItem item;
      TakeStatus st = ended[h] ? TakeStatus::kEnd : q.Take(&item, Clock::now() + milliseconds(50));
      if (st == TakeStatus::kEnd) ended[h] = true;
      if (st != TakeStatus::kOk) continue;
      if (!out.first.emplace(item.ticket, std::make_pair(h == 0 ? "a" : "b", item.begin)).second)
        ++out.repeats;
      EXPECT_EQ(q.Ack(item), ItemStatus::kOk);
    }
  }
  EXPECT_TRUE(ended[0] && ended[1]) << "the restored job did not end";
  return out;
}

// An exact checkpoint of a job across hosts: each host's SaveHostState, then
// SaveStateWithHosts, restored on each host with FedRestoreState. Each host
// resumes the item it held where it had committed it; every ticket that no
// host had acked comes once; none acked before comes again, though the run
// went on past the checkpoint in the tier (the restore replaces it). Twice
// from one checkpoint: each restore has a token of its own.
TEST_F(CoordinatedQueueTest, AnExactCheckpointResumesWhatEachHostHeldAndHandsOutTheRestOnce) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  job_.url = redis.url();
  job_.name = UniqueJob("exact");
  job_.seed = 11;
  auto a = WorkQueue::Open(Options(job_, "a", 1));
  auto b = WorkQueue::Open(Options(job_, "b", 1));
  const uint64_t total = a->num_items() * kEpochs;
  const auto deadline = [] { return Clock::now() + std::chrono::seconds(10); };
  std::set<uint64_t> before;  // acked before the checkpoint
  WorkItem item;
  for (int i = 0; i < 40; ++i) {
    for (WorkQueue* q : {a.get(), b.get()}) {
      ASSERT_EQ(q->Take(&item, deadline()), TakeStatus::kOk);
      ASSERT_EQ(q->Ack(item), ItemStatus::kOk);
      before.insert(item.ticket);
    }
  }
  // Each host holds an item delivered up to its middle (a loader's batches
  // published and used), and host a one it has not started.
  WorkItem held_a, held_b, fresh_a;
  ASSERT_EQ(a->Take(&held_a, deadline()), TakeStatus::kOk);
  ASSERT_EQ(b->Take(&held_b, deadline()), TakeStatus::kOk);
  ASSERT_EQ(a->Take(&fresh_a, deadline()), TakeStatus::kOk);
  const uint64_t mid_a = (held_a.begin + held_a.end) / 2, mid_b = (held_b.begin + held_b.end) / 2;
  ASSERT_EQ(a->Commit(held_a, mid_a), ItemStatus::kOk);
  ASSERT_EQ(b->Commit(held_b, mid_b), ItemStatus::kOk);
  const std::string host_a = a->SaveHostState(), host_b = b->SaveHostState();
  const std::string tier = b->SaveStateWithHosts({host_a, host_b});
  // The run goes on past the checkpoint, then stops: none of it counts.
  ASSERT_EQ(a->Ack(held_a), ItemStatus::kOk);
  ASSERT_EQ(a->Ack(fresh_a), ItemStatus::kOk);
  ASSERT_EQ(b->Ack(held_b), ItemStatus::kOk);
  for (int i = 0; i < 30; ++i) {
    for (WorkQueue* q : {a.get(), b.get()}) {
      ASSERT_EQ(q->Take(&item, deadline()), TakeStatus::kOk);
      ASSERT_EQ(q->Ack(item), ItemStatus::kOk);
    }
  }
  a->Close();
  b->Close();
  EXPECT_GE(JobStats(job_).done, before.size() + 63) << "the old run's acks reached the tier";

  for (const char* token : {"restore-1", "restore-2"}) {
    SCOPED_TRACE(token);
    Job on_a = job_, on_b = job_;
    on_a.restore_state = FedRestoreState(tier, host_a, token);
    on_b.restore_state = FedRestoreState(tier, host_b, token);
    auto ra = WorkQueue::Open(Options(on_a, "a", 1));
    auto rb = WorkQueue::Open(Options(on_b, "b", 1));
    Handed handed = DrainBoth(*ra, *rb);
    ra->Close();
    rb->Close();
    EXPECT_EQ(handed.repeats, 0);
    EXPECT_EQ(handed.first.size() + before.size(), total);
    for (uint64_t t : before) EXPECT_EQ(handed.first.count(t), 0u) << "ticket " << t;
    EXPECT_EQ(handed.first[held_a.ticket], std::make_pair(std::string("a"), mid_a));
    EXPECT_EQ(handed.first[held_b.ticket], std::make_pair(std::string("b"), mid_b));
    EXPECT_EQ(handed.first[fresh_a.ticket].second, fresh_a.begin) << "not started: read whole";
    EXPECT_EQ(JobStats(job_).done, total);
  }
}

TEST_F(CoordinatedQueueTest, AQueueKeptFromAnotherRunOfTheJobIsNotResumed) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  job_.url = redis.url();
  job_.name = UniqueJob("kept");
  job_.seed = 7;  // the new run's order is the old one's: the queue's configuration matches
  job_.work_per_item = milliseconds(5);
  const uint64_t total = NumItems(job_) * kEpochs;
  Host old_run = StartHost(job_, "a", 1, dir_.path());
  auto give_up = Clock::now() + std::chrono::seconds(20);
  while (Counts({old_run}).size() < 30 && Clock::now() < give_up)
    std::this_thread::sleep_for(milliseconds(5));
  kill(old_run.pids[0], SIGKILL);
  Wait(old_run);
  ASSERT_TRUE(std::filesystem::exists(SegmentPath(job_.name + ".a"))) << "not kept";
  RedisCli(redis.port(), "--scan --pattern 'tailcut:{" + job_.name + "}:*' | xargs redis-cli -p " +
                             std::to_string(redis.port()) + " del");
  try {
    WorkQueue::Open(Options(job_, "a", 1));
    FAIL() << "a process of the new run resumed the old run's queue";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfigMismatch);
    EXPECT_EQ(std::string(e.what()),
              "queue '" + job_.name + ".a' was fed by another run of job '" + job_.name + "' on " +
                  redis.url() +
                  " (the job was created again since): its done items are not this run's. Stop "
                  "the processes of the run before; once none is left, open the queue again and "
                  "it starts afresh");
  }
  // No process of the old run is left: the refused open removed its queue,
  // and the new run reads every item of its own, once.
  EXPECT_FALSE(std::filesystem::exists(SegmentPath(job_.name + ".a")));
  Host new_run = StartHost(job_, "a", 1, dir_.path(), "-new");
  for (int code : Wait(new_run)) EXPECT_EQ(code, 0) << "host a, new run";
  std::map<uint64_t, int> counts = Counts({new_run});
  EXPECT_EQ(counts.size(), total) << "missing, e.g.: " << Missing(counts, total);
  for (const auto& [key, n] : counts) EXPECT_EQ(n, 1) << "key " << key;
  EXPECT_EQ(JobStats(job_).done, total);
}

TEST_F(CoordinatedQueueTest, HostsWithAnotherConfigurationAreRefusedNamingTheField) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  job_.url = redis.url();
  job_.name = UniqueJob("mismatch");
  auto first = WorkQueue::Open(Options(job_, "a", 1));
  WorkQueueOptions other = Options(job_, "b", 1);
  other.num_epochs = kEpochs + 1;
  try {
    WorkQueue::Open(other);
    FAIL() << "a host with other num_epochs joined";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfigMismatch);
    EXPECT_NE(std::string(e.what()).find("num_epochs"), std::string::npos) << e.what();
  }
  first->Close();
}

TEST_F(CoordinatedQueueTest, RedisDownOrAWrongPasswordAreNamedErrors) {
  SKIP_WITHOUT_REDIS();
  job_.name = UniqueJob("errors");
  {
    RedisServer redis({"--requirepass", "right"});
    job_.url = "redis://:wrong@127.0.0.1:" + std::to_string(redis.port()) + "/0";
    try {
      WorkQueue::Open(Options(job_, "a", 1));
      FAIL() << "a wrong password was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kPermission);
      EXPECT_EQ(std::string(e.what()).find("wrong"), std::string::npos) << e.what();
    }
  }
  job_.url = "redis://127.0.0.1:" + std::to_string(testing::FreePort()) + "/0";
  WorkQueueOptions o = Options(job_, "a", 1);
  auto start = Clock::now();
  try {
    WorkQueue::Open(o);
    FAIL() << "opened with Redis down";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("cannot reach Redis"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
  EXPECT_FALSE(std::filesystem::exists(SegmentPath(job_.name + ".a")));
}

TEST_F(CoordinatedQueueTest, ABadHostIdIsRefusedBeforeAnythingIsCreated) {
  SKIP_WITHOUT_REDIS();
  RedisServer redis;
  job_.url = redis.url();
  job_.name = UniqueJob("hostid");
  try {
    WorkQueue::Open(Options(job_, "has space", 1));
    FAIL() << "a host id with a space was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("host id 'has space'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tailcut
