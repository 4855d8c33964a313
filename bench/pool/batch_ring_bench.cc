// bench/pool/batch_ring_bench.cc: handing a batch from a loader process to a
// trainer process through the batch ring, beside the copy a DataLoader-style
// worker → main transfer makes, and the wake-up latency of a waiting trainer.
//
//   BM_RingHandOff/<bytes>    a loader child acquires a slot and publishes
//                             it, as fast as the ring lets it; each iteration
//                             of the parent (a trainer) pops one batch,
//                             reads one byte of it in place and releases it.
//                             The batch is never copied: the cost is the
//                             hand-off itself.
//   BM_SocketCopy/<bytes>     the baseline: a worker child writes each batch
//                             into a Unix stream socket (send), each iteration
//                             of the parent reads one whole batch back (recv)
//                             into its own buffer: the copy in and out of the
//                             kernel that a worker → main transfer of raw
//                             bytes makes. No serialisation is added, which
//                             favours the baseline.
//   BM_RingWakeLatency        a trainer child sleeps in Pop (futex); the
//                             parent publishes one batch every 2 ms with its
//                             CLOCK_MONOTONIC stamp in the user header; the
//                             trainer records now − stamp. Counters: median
//                             and p99 in microseconds over the samples.
//
// After the runs it prints the per-batch time of each and the ratio
// socket copy / ring hand-off. Results: docs/batch_ring.md.
//
// Fork rule: the parent opens its ring only after forking, so the child
// never inherits a holder thread (see tailcut/batch_ring.h).
#include <benchmark/benchmark.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tailcut/batch_ring.h"

namespace {

using tailcut::BatchRing;
using tailcut::RingStatus;
using Clock = std::chrono::steady_clock;

std::map<std::string, double> g_ns_per_batch;

uint64_t NowNs() {
  struct timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
}

tailcut::BatchRingOptions Options(const std::string& name, uint64_t bytes) {
  tailcut::BatchRingOptions o;
  o.name = name;
  o.slot_bytes = bytes;
  o.num_slots = 4;
  o.max_clients = 4;
  return o;
}

std::string RingName(const char* what) {
  return std::string("ringbench.") + what + "." + std::to_string(::getpid());
}

void Reap(pid_t pid) {
  int status;
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void BM_RingHandOff(benchmark::State& state) {
  const uint64_t bytes = static_cast<uint64_t>(state.range(0));
  const std::string name = RingName("handoff");
  tailcut::RemoveBatchRing(name);
  pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 0;
    try {
      auto ring = BatchRing::Open(Options(name, bytes), tailcut::RingRole::kLoader);
      for (uint64_t n = 0;; ++n) {
        tailcut::WritableBatch w;
        if (ring->AcquireSlot(&w, Clock::now() + std::chrono::seconds(5)) != RingStatus::kOk) break;
        w.data[0] = std::byte(n);
        if (ring->Publish(w.token, 0, n, bytes) != RingStatus::kOk) {
          ring->Abandon(w.token);
          break;
        }
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "loader: %s\n", e.what());
      rc = 1;
    }
    ::_exit(rc);
  }
  auto ring = BatchRing::Open(Options(name, bytes), tailcut::RingRole::kTrainer);
  uint64_t sum = 0;
  auto t0 = Clock::now();
  for (auto _ : state) {
    tailcut::ReadyBatch r;
    if (ring->Pop(BatchRing::kAllEpochs, &r, Clock::now() + std::chrono::seconds(5)) !=
        RingStatus::kOk) {
      state.SkipWithError("Pop failed");
      break;
    }
    sum += static_cast<uint64_t>(r.data[0]);
    ring->Release(r.token);
  }
  double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  benchmark::DoNotOptimize(sum);
  ring->Close();
  Reap(pid);
  ring.reset();
  tailcut::RemoveBatchRing(name);
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(bytes));
  g_ns_per_batch["ring hand-off"] = ns / double(std::max<int64_t>(1, state.iterations()));
}

bool SendAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= size_t(k);
  }
  return true;
}

bool RecvAll(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= size_t(k);
  }
  return true;
}

void BM_SocketCopy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
    state.SkipWithError("socketpair failed");
    return;
  }
  int sndbuf = 4 << 20;
  ::setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
  ::setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &sndbuf, sizeof(sndbuf));
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(sv[0]);
    std::vector<char> batch(bytes, 1);
    for (uint64_t n = 0;; ++n) {
      batch[0] = char(n);
      if (!SendAll(sv[1], batch.data(), bytes)) break;
    }
    ::_exit(0);
  }
  ::close(sv[1]);
  std::vector<char> in(bytes);
  uint64_t sum = 0;
  auto t0 = Clock::now();
  for (auto _ : state) {
    if (!RecvAll(sv[0], in.data(), bytes)) {
      state.SkipWithError("recv failed");
      break;
    }
    sum += uint64_t(in[0]);
  }
  double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  benchmark::DoNotOptimize(sum);
  ::close(sv[0]);
  Reap(pid);
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(bytes));
  g_ns_per_batch["socket copy"] = ns / double(std::max<int64_t>(1, state.iterations()));
}

void BM_RingWakeLatency(benchmark::State& state) {
  constexpr int kSamples = 400;
  const std::string name = RingName("wake");
  tailcut::RemoveBatchRing(name);
  auto* lat =
      static_cast<uint64_t*>(::mmap(nullptr, sizeof(uint64_t) * kSamples, PROT_READ | PROT_WRITE,
                                    MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  for (auto _ : state) {
    std::memset(lat, 0, sizeof(uint64_t) * kSamples);
    pid_t pid = ::fork();
    if (pid == 0) {
      auto ring = BatchRing::Open(Options(name, 4096), tailcut::RingRole::kTrainer);
      for (int i = 0; i < kSamples; ++i) {
        tailcut::ReadyBatch r;
        if (ring->Pop(BatchRing::kAllEpochs, &r, Clock::now() + std::chrono::seconds(5)) !=
            RingStatus::kOk)
          break;
        uint64_t now = NowNs(), stamp;
        std::memcpy(&stamp, r.user_header.data(), sizeof(stamp));
        lat[i] = now - stamp;
        ring->Release(r.token);
      }
      ::_exit(0);
    }
    auto ring = BatchRing::Open(Options(name, 4096), tailcut::RingRole::kLoader);
    for (int i = 0; i < kSamples; ++i) {
      // Long enough for the trainer to be asleep in the futex, not spinning.
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      tailcut::WritableBatch w;
      if (ring->AcquireSlot(&w, Clock::now() + std::chrono::seconds(5)) != RingStatus::kOk) break;
      uint64_t stamp = NowNs();
      std::memcpy(w.user_header.data(), &stamp, sizeof(stamp));
      ring->Publish(w.token, 0, i, 0);
    }
    Reap(pid);
    ring->Close();
    ring.reset();
  }
  tailcut::RemoveBatchRing(name);
  std::vector<uint64_t> v(lat, lat + kSamples);
  v.erase(std::remove(v.begin(), v.end(), 0), v.end());
  std::sort(v.begin(), v.end());
  ::munmap(lat, sizeof(uint64_t) * kSamples);
  if (v.empty()) {
    state.SkipWithError("no samples");
    return;
  }
  state.counters["median_us"] = double(v[v.size() / 2]) / 1e3;
  state.counters["p99_us"] = double(v[v.size() * 99 / 100]) / 1e3;
  state.counters["max_us"] = double(v.back()) / 1e3;
  state.counters["samples"] = double(v.size());
}

BENCHMARK(BM_RingHandOff)->Arg(4 << 20)->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_SocketCopy)->Arg(4 << 20)->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_RingWakeLatency)->Iterations(1)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  for (const auto& [what, ns] : g_ns_per_batch)
    std::printf("%-14s %10.1f us per 4 MiB batch\n", what.c_str(), ns / 1e3);
  auto ring = g_ns_per_batch.find("ring hand-off"), copy = g_ns_per_batch.find("socket copy");
  if (ring != g_ns_per_batch.end() && copy != g_ns_per_batch.end() && ring->second > 0)
    std::printf("ratio socket copy / ring hand-off: %.1fx\n", copy->second / ring->second);
  return 0;
}
