// global_bench: what the global tier costs over loopback. For a few block
// sizes and client counts, each client (a thread with its own GlobalTier and
// connection) loops Claim + Ack of the whole block for a fixed time, against
// a redis-server this program starts on 127.0.0.1 (appendonly yes, with
// appendfsync always and then everysec). Baseline in the same run: PING round
// trips on one plain hiredis connection. Results: docs/global.md.
//
//   build/bin/global_bench [seconds per cell, default 2]
#include <hiredis/hiredis.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "global/redis_server.h"
#include "tailcut/global_tier.h"

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// PING round trips per second on one connection.
double PingRate(int port, double seconds) {
  redisContext* c = redisConnect("127.0.0.1", port);
  uint64_t n = 0;
  Clock::time_point start = Clock::now(),
                    end = start + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  while (Clock::now() < end) {
    freeReplyObject(redisCommand(c, "PING"));
    ++n;
  }
  double rate = n / Seconds(Clock::now() - start);
  redisFree(c);
  return rate;
}

struct Cell {
  uint64_t blocks = 0;
  uint64_t tickets = 0;
  double seconds = 0;
};

Cell Run(const std::string& url, const std::string& job, uint64_t block_size, int clients,
         double seconds) {
  std::vector<std::unique_ptr<tailcut::GlobalTier>> tiers;
  for (int i = 0; i < clients; ++i) {
    tailcut::GlobalTierOptions options;
    options.coordinator = url;
    options.host_id = "bench" + std::to_string(i);
    options.job = {job, uint64_t{1} << 40, 1, block_size, 1, "bench"};
    options.on_notice = [](const std::string&) {};
    tiers.push_back(tailcut::GlobalTier::Open(options));
  }
  std::atomic<uint64_t> blocks{0}, tickets{0};
  Clock::time_point start = Clock::now(),
                    end = start + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  std::vector<std::thread> threads;
  for (auto& tier : tiers) {
    threads.emplace_back([&, t = tier.get()] {
      tailcut::GlobalBlock block;
      uint64_t my_blocks = 0, my_tickets = 0;
      while (Clock::now() < end) {
        if (t->Claim(milliseconds(60000), &block) != tailcut::GlobalClaimStatus::kOk) abort();
        if (t->Ack(block, block.tickets) != tailcut::GlobalAckStatus::kOk) abort();
        ++my_blocks;
        my_tickets += block.tickets.size();
      }
      blocks += my_blocks;
      tickets += my_tickets;
    });
  }
  for (auto& t : threads) t.join();
  return {blocks, tickets, Seconds(Clock::now() - start)};
}

}  // namespace

int main(int argc, char** argv) {
  if (tailcut::testing::FindRedisServer().empty()) {
    fprintf(stderr, "global_bench: redis-server is not installed (apt-get install redis-server)\n");
    return 1;
  }
  const double seconds = argc > 1 ? atof(argv[1]) : 2.0;
  printf("%-9s %6s %7s %12s %12s %14s %10s %12s\n", "fsync", "block", "clients", "ops/s",
         "tickets/s", "us/ticket", "ping/s", "ops/ping");
  for (const char* fsync : {"always", "everysec"}) {
    tailcut::testing::RedisServer redis({"--appendfsync", fsync});
    const double ping = PingRate(redis.port(), seconds);
    int job = 0;
    for (uint64_t block : {1, 8, 64, 512}) {
      for (int clients : {1, 4}) {
        Cell cell = Run(redis.url(), "bench" + std::to_string(job++), block, clients, seconds);
        // One block = one Claim + one Ack script call.
        const double ops = 2.0 * cell.blocks / cell.seconds;
        printf("%-9s %6llu %7d %12.0f %12.0f %14.3f %10.0f %12.2f\n", fsync,
               static_cast<unsigned long long>(block), clients, ops, cell.tickets / cell.seconds,
               1e6 * cell.seconds / cell.tickets, ping, ops / ping);
        fflush(stdout);
      }
    }
  }
  return 0;
}
