#include "shuffle.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <mutex>
#include <new>
#include <set>

#include "conversions.h"
#include "errors.h"

namespace tailcut::python {

namespace {

// Pops `key` from the keywords; nullopt when absent. None is a value like
// any other: only shuffle_seed takes it (the queue's seed, docs/python.md).
std::optional<py::object> Pop(py::kwargs& options, const char* key) {
  if (!options.contains(key)) return std::nullopt;
  py::object v = options[key];
  if (PyDict_DelItemString(options.ptr(), key) != 0) throw py::error_already_set();
  return v;
}

constexpr uint64_t kPage = 4096;

}  // namespace

ShuffleArgs PopShuffleArgs(py::kwargs& options) {
  ShuffleArgs args;
  if (auto v = Pop(options, "shuffle_buffer")) {
    args.buffer = ToU64(*v, "shuffle_buffer");
    if (args.buffer > kMaxShuffleBuffer)
      Raise(g_exc.invalid_argument,
            "shuffle_buffer must be at most 2**24 records, got " + std::to_string(args.buffer));
  }
  if (auto v = Pop(options, "interleave")) {
    uint64_t k = ToU64(*v, "interleave", 1);
    if (k > kMaxInterleave)
      Raise(g_exc.invalid_argument, "interleave must be 1 to " + std::to_string(kMaxInterleave) +
                                        ", got " + std::to_string(k));
    args.interleave = static_cast<uint32_t>(k);
  }
  if (auto v = Pop(options, "shuffle_seed")) args.seed = ToU64OrNone(*v, "shuffle_seed");
  return args;
}

void ShareReaderOptions(const QueueHandle& h, const ShuffleArgs& args, const char* caller,
                        GivenReaderOptions given, tc::ReaderOptions* ro) {
  const uint64_t k = args.interleave;
  if (k <= 1) return;
  const uint64_t leases = h.leases_per_client;
  const std::string who = std::string(caller) + "(interleave=" + std::to_string(k) + ")";
  if (!given.prefetch_items) {
    if (leases < k)
      Raise(g_exc.invalid_argument,
            who + ": " + std::to_string(k) + " Readers need at least one lease each, but queue '" +
                h.name + "' has leases_per_client=" + std::to_string(leases) +
                "; lower interleave, or open the queue with leases_per_client >= " +
                std::to_string(k) + " (in every process)");
    // No item ahead: k Readers already read k items at once, and every item
    // held is one that a faster process cannot take.
    ro->prefetch_items = 0;
  }
  const uint64_t need = k * (uint64_t{ro->prefetch_items} + 1);
  if (need > leases)
    Raise(g_exc.invalid_argument,
          who + " with prefetch_items=" + std::to_string(ro->prefetch_items) +
              ": the Readers hold up to " + std::to_string(need) + " items, but queue '" + h.name +
              "' has leases_per_client=" + std::to_string(leases) +
              "; lower interleave or prefetch_items, or open the queue with leases_per_client >= " +
              std::to_string(need) + " (in every process)");
  const uint64_t budget = ro->buffer_budget_bytes;
  const uint64_t each = budget / k;
  if (!given.chunk_bytes)
    ro->chunk_bytes = std::clamp<uint64_t>(each / 4 / kPage * kPage, kPage, ro->chunk_bytes);
  const uint64_t chunk = (ro->chunk_bytes + kPage - 1) / kPage * kPage;
  if (each < 3 * chunk)
    Raise(g_exc.invalid_argument,
          who + ": buffer_budget_bytes (" + std::to_string(budget) + ") is shared by " +
              std::to_string(k) + " Readers, " + std::to_string(each) +
              " bytes each, less than the 3 chunks of chunk_bytes (" + std::to_string(chunk) +
              ") a Reader needs; raise buffer_budget_bytes to at least " +
              std::to_string(3 * chunk * k) + ", or lower chunk_bytes or interleave");
  ro->buffer_budget_bytes = each;
}

std::function<void(const std::string&)> OncePerLine(std::function<void(const std::string&)> out) {
  struct Seen {
    std::mutex mu;
    std::set<std::string> lines;
  };
  auto seen = std::make_shared<Seen>();
  return [seen, out = std::move(out)](const std::string& line) {
    {
      std::lock_guard<std::mutex> lock(seen->mu);
      if (!seen->lines.insert(line).second) return;
    }
    if (out) {
      out(line);
    } else {
      fprintf(stderr, "%s\n", line.c_str());
    }
  };
}

void ShuffledBatches::Emit(size_t i, size_t want, tc::Batch* out) {
  Group& g = groups_[i];
  out->epoch = g.epoch;
  out->in_place = false;
  if (g.count() <= want) {
    out->count = g.count();
    out->storage = std::move(g.data);
    out->offsets = std::move(g.offsets);
    out->files = std::move(g.files);
    groups_.erase(groups_.begin() + static_cast<std::ptrdiff_t>(i));
  } else {  // read(n) asked for fewer than the group holds: hand out its first `want`
    const auto cut = static_cast<size_t>(g.offsets[want]);
    out->count = want;
    out->storage.assign(g.data.begin(), g.data.begin() + static_cast<std::ptrdiff_t>(cut));
    out->offsets.assign(g.offsets.begin(),
                        g.offsets.begin() + static_cast<std::ptrdiff_t>(want + 1));
    g.data.erase(g.data.begin(), g.data.begin() + static_cast<std::ptrdiff_t>(cut));
    g.offsets.erase(g.offsets.begin(), g.offsets.begin() + static_cast<std::ptrdiff_t>(want));
    for (int64_t& o : g.offsets) o -= static_cast<int64_t>(cut);
    if (record_files_) {
      const auto split = g.files.begin() + static_cast<std::ptrdiff_t>(want);
      out->files.assign(g.files.begin(), split);
      g.files.erase(g.files.begin(), split);
    }
  }
  out->data = out->storage.data();
  // Every record the Shuffler handed out is in batches the caller has: a
  // checkpoint it takes now counts them as used.
  if (groups_.empty()) shuffler_.ReportUsed();
}

tc::ReadStatus ShuffledBatches::Drain(size_t want, tc::Batch* out, tc::ReadStatus status) {
  if (ended_ && drop_last_) {
    groups_.erase(std::remove_if(groups_.begin(), groups_.end(),
                                 [&](const Group& g) { return g.count() < want; }),
                  groups_.end());
  }
  if (groups_.empty()) return status;
  Emit(0, want, out);
  return tc::ReadStatus::kOk;
}

tc::ReadStatus ShuffledBatches::Next(tc::Batch* out, size_t want, tc::Deadline deadline) noexcept {
  out->count = 0;
  out->files.clear();
  out->in_place = false;
  out->data = nullptr;
  // Every record handed out so far left in a batch the consumer now used.
  if (groups_.empty()) shuffler_.Release();
  try {
    if (failed_) return Drain(want, out, tc::ReadStatus::kError);
    if (ended_) return Drain(want, out, tc::ReadStatus::kEnd);
    for (;;) {
      const bool holding = !groups_.empty();
      tc::Record record;
      tc::ReadStatus status =
          shuffler_.Next(&record, holding && short_at_end_ ? tc::Deadline::min() : deadline);
      switch (status) {
        case tc::ReadStatus::kOk: {
          const uint64_t epoch = shuffler_.epoch();
          size_t i = 0;
          while (i < groups_.size() && groups_[i].epoch != epoch) ++i;
          if (i == groups_.size()) {
            groups_.emplace_back();
            groups_.back().epoch = epoch;
          }
          Group& g = groups_[i];
          const auto* p = reinterpret_cast<const uint8_t*>(record.data);
          g.data.insert(g.data.end(), p, p + record.size);
          g.offsets.push_back(static_cast<int64_t>(g.data.size()));
          if (record_files_) g.files.push_back(shuffler_.file());
          if (g.count() >= want) {
            Emit(i, want, out);
            return tc::ReadStatus::kOk;
          }
          break;
        }
        case tc::ReadStatus::kEmpty:
        case tc::ReadStatus::kHoldsFinished:  // a Reader's, which the Shuffler handles
          // The deadline passed at the end of the data: a short batch of
          // what is here, or kEmpty holding nothing.
          if (!holding) {
            // Items a Reader handed over in this last call may have all their
            // records in batches already used: done, not given back at close.
            shuffler_.Release();
            return tc::ReadStatus::kEmpty;
          }
          Emit(0, want, out);
          return tc::ReadStatus::kOk;
        case tc::ReadStatus::kEnd:
        case tc::ReadStatus::kError:
        case tc::ReadStatus::kForked:  // never: Python checks the pid first
          (status == tc::ReadStatus::kEnd ? ended_ : failed_) = true;
          if (!holding) shuffler_.Release();  // as for kEmpty
          return Drain(want, out, status);
      }
    }
  } catch (const std::bad_alloc&) {
    failed_ = failed_own_ = true;
    error_ = "batches: out of memory packing shuffled records; lower batch_size or shuffle_buffer";
    groups_.clear();
    out->count = 0;
    return tc::ReadStatus::kError;
  }
}

}  // namespace tailcut::python
