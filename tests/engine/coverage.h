// tests/engine/coverage.h: exactly-once accounting: per-(epoch, item) ack
// counts (ExactlyOnce), or acked byte ranges that must tile each item when
// tails may be split (Coverage).
#ifndef TAILCUT_TESTS_ENGINE_COVERAGE_H_
#define TAILCUT_TESTS_ENGINE_COVERAGE_H_

#include <algorithm>
#include <cstdint>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tailcut/work_queue.h"

namespace tailcut::test {

// (epoch, index) -> a dense key.
inline uint64_t Key(uint64_t num_items, uint64_t epoch, uint64_t index) {
  return epoch * num_items + index;
}

// Checks per-(epoch,index) counts are all exactly 1; "" when they are.
inline std::string ExactlyOnce(const std::vector<uint32_t>& counts, uint64_t num_items) {
  std::ostringstream out;
  int shown = 0;
  uint64_t missing = 0, dup = 0;
  for (uint64_t k = 0; k < counts.size(); ++k) {
    if (counts[k] == 1) continue;
    (counts[k] == 0 ? missing : dup) += 1;
    if (shown++ < 8) {
      out << " (epoch " << k / num_items << ", item " << k % num_items << ") x" << counts[k] << ";";
    }
  }
  if (missing == 0 && dup == 0) return "";
  return std::to_string(missing) + " missing, " + std::to_string(dup) + " duplicated:" + out.str();
}

// Byte-range accounting, for queues whose items may be split: per (epoch,
// item), the acked ranges must tile the item's [begin, end) exactly once.
class Coverage {
 public:
  Coverage(std::vector<WorkQueue::Item> items, uint64_t num_epochs)
      : items_(std::move(items)), ranges_(items_.size() * num_epochs), uncertain_(ranges_.size()) {}

  uint64_t num_items() const { return items_.size(); }
  // An acked range; false if it lies outside the queue.
  bool Add(uint64_t epoch, uint64_t index, uint64_t begin, uint64_t end) {
    const uint64_t k = Key(items_.size(), epoch, index);
    if (index >= items_.size() || k >= ranges_.size()) return false;
    ranges_[k].emplace_back(begin, end);
    return true;
  }
  // A range whose Ack a killed process may or may not have finished.
  void AddUncertain(uint64_t epoch, uint64_t index, uint64_t begin, uint64_t end) {
    const uint64_t k = Key(items_.size(), epoch, index);
    if (index < items_.size() && k < uncertain_.size()) uncertain_[k].emplace_back(begin, end);
  }

  // "" when every item of every epoch is covered exactly once (an uncertain
  // range may fill a gap it exactly matches), else the first problems.
  std::string Check() const {
    std::ostringstream out;
    int shown = 0;
    for (uint64_t k = 0; k < ranges_.size() && shown < 8; ++k) {
      const WorkQueue::Item& ref = items_[k % items_.size()];
      auto r = ranges_[k];
      std::sort(r.begin(), r.end());
      std::string bad;
      uint64_t pos = ref.begin;
      for (const auto& [b, e] : r) {
        if (b < pos) {
          bad = "bytes [" + std::to_string(b) + ", " + std::to_string(std::min(e, pos)) +
                ") acked twice";
          break;
        }
        if (b > pos) {
          // A gap: only a dead process's unfinished ack may fill it, exactly.
          if (!FillsGap(k, pos, b)) {
            bad = "bytes [" + std::to_string(pos) + ", " + std::to_string(b) + ") never acked";
            break;
          }
        }
        if (e < b) {
          bad = "empty-reversed range";
          break;
        }
        pos = e;
      }
      if (bad.empty() && r.empty() && ref.begin == ref.end && !FillsGap(k, ref.begin, ref.end)) {
        bad = "empty item never acked";
      }
      if (bad.empty() && pos < ref.end && !FillsGap(k, pos, ref.end)) {
        bad = "bytes [" + std::to_string(pos) + ", " + std::to_string(ref.end) + ") never acked";
      }
      if (bad.empty() && pos > ref.end) bad = "acked past the item's end";
      if (!bad.empty()) {
        out << " (epoch " << k / items_.size() << ", item " << k % items_.size() << " ["
            << ref.begin << ", " << ref.end << ")): " << bad << ";";
        ++shown;
      }
    }
    return out.str();
  }

 private:
  bool FillsGap(uint64_t k, uint64_t b, uint64_t e) const {
    // The gap must be the union of uncertain ranges, back to back: e must
    // be reachable from b. Sorted by start, every range that can end at a
    // start comes before it.
    auto u = uncertain_[k];
    std::sort(u.begin(), u.end());
    std::set<uint64_t> reach{b};
    for (const auto& [ub, ue] : u) {
      if (ue <= e && reach.count(ub) != 0) reach.insert(ue);
    }
    return reach.count(e) != 0;
  }
  std::vector<WorkQueue::Item> items_;
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> ranges_;
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> uncertain_;
};

}  // namespace tailcut::test

#endif  // TAILCUT_TESTS_ENGINE_COVERAGE_H_
