// SampleOrder: a batch's positions mapped to sample numbers one by one
// (operator[]) against all at once (Fill), over an index work of 400,000
// samples (a global shuffle of 400,000 records) and of 2^20 + 1 (the longest
// cycle walks). Per position; the ratio of the two is what Fill saves.
//
//   build/bin/sample_order_bench --benchmark_repetitions=5 \
//       --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tailcut/sample_order.h"
#include "tailcut/work_queue.h"

namespace {

constexpr uint64_t kBatch = 256;

// The queue (its name unique to this process, removed at the end) and the
// order of its epoch 0.
struct Order {
  explicit Order(uint64_t n) {
    tailcut::WorkQueueOptions o;
    o.name = "sample-order-bench-" + std::to_string(::getpid()) + "-" + std::to_string(n);
    o.num_samples = n;
    o.seed = 7;
    queue = tailcut::WorkQueue::Open(o);
    order = std::make_unique<tailcut::SampleOrder>(*queue, 0);
  }
  ~Order() {
    const std::string name = queue->name();
    order.reset();
    queue.reset();
    try {
      tailcut::RemoveQueue(name, /*force=*/false);
    } catch (const tailcut::Error&) {
      // Removed with its last client already.
    }
  }
  std::unique_ptr<tailcut::WorkQueue> queue;
  std::unique_ptr<tailcut::SampleOrder> order;
};

void BM_OneByOne(benchmark::State& state) {
  const uint64_t n = static_cast<uint64_t>(state.range(0));
  Order o(n);
  std::vector<uint64_t> out(kBatch);
  uint64_t begin = 0;
  for (auto _ : state) {
    for (uint64_t i = 0; i < kBatch; ++i) out[i] = (*o.order)[begin + i];
    benchmark::DoNotOptimize(out.data());
    begin = begin + 2 * kBatch <= n ? begin + kBatch : 0;
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kBatch));
}

void BM_Fill(benchmark::State& state) {
  const uint64_t n = static_cast<uint64_t>(state.range(0));
  Order o(n);
  std::vector<uint64_t> out(kBatch);
  uint64_t begin = 0;
  for (auto _ : state) {
    o.order->Fill(begin, begin + kBatch, out.data());
    benchmark::DoNotOptimize(out.data());
    begin = begin + 2 * kBatch <= n ? begin + kBatch : 0;
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kBatch));
}

}  // namespace

BENCHMARK(BM_OneByOne)->Arg(400000)->Arg((1 << 20) + 1);
BENCHMARK(BM_Fill)->Arg(400000)->Arg((1 << 20) + 1);
BENCHMARK_MAIN();
