#include "global/tier_state.h"

#include <charconv>
#include <cstdio>
#include <string_view>

#include "engine/checkpoint.h"
#include "tailcut/error.h"
#include "tailcut/global_tier.h"

namespace tailcut {

namespace detail {

namespace {

constexpr std::string_view kStateMagic = "tailcut-global-state 1";

}  // namespace

TierState ParseTierState(const std::string& state) {
  auto corrupt = [](const std::string& what) {
    return Error(ErrorKind::kCorrupt,
                 "global restore_state is not a state from "
                 "GlobalTier::SaveState (" +
                     what + ")");
  };
  size_t newline = state.find('\n');
  if (state.compare(0, kStateMagic.size(), kStateMagic) != 0 || newline == std::string::npos) {
    throw corrupt("no 'tailcut-global-state 1' header");
  }
  TierState saved;
  uint64_t files_size = 0, bitmap_size = 0;
  const char* p = state.data() + kStateMagic.size();
  const char* end = state.data() + newline;
  for (uint64_t* field : {&saved.items, &saved.epochs, &saved.block, &saved.seed, &saved.cursor,
                          &files_size, &bitmap_size}) {
    if (p >= end || *p != ' ') throw corrupt("header fields missing");
    auto [next, ec] = std::from_chars(p + 1, end, *field);
    if (ec != std::errc()) throw corrupt("a header field is not a number");
    p = next;
  }
  if (p != end || state.size() - newline - 1 != files_size + bitmap_size) {
    throw corrupt("its length does not match its header");
  }
  saved.files = state.substr(newline + 1, files_size);
  saved.bitmap = state.substr(newline + 1 + files_size);
  return saved;
}

std::string SerializeTierState(TierState s) {
  while (!s.bitmap.empty() && s.bitmap.back() == '\0') s.bitmap.pop_back();
  std::string state(kStateMagic);
  for (uint64_t field :
       {s.items, s.epochs, s.block, s.seed, s.cursor, static_cast<uint64_t>(s.files.size()),
        static_cast<uint64_t>(s.bitmap.size())}) {
    state += ' ';
    state += std::to_string(field);
  }
  state += "\n" + s.files + s.bitmap;
  return state;
}

}  // namespace detail

std::string GlobalStateWithHosts(const std::string& tier_state,
                                 const std::vector<std::string>& host_states) {
  detail::TierState tier = detail::ParseTierState(tier_state);
  const uint64_t total = tier.items * tier.epochs;
  const uint64_t handed_out = std::min(tier.cursor, total);
  std::string bitmap((handed_out + 7) / 8, '\0');
  for (size_t h = 0; h < host_states.size(); ++h) {
    const std::string what = "host state " + std::to_string(h);
    detail::SavedState s = detail::DeserializeState(what, host_states[h]);
    char files[17];
    std::snprintf(files, sizeof(files), "%016llx", static_cast<unsigned long long>(s.fingerprint));
    if (s.num_items != tier.items || s.num_epochs != tier.epochs || s.seed != tier.seed ||
        files != tier.files)
      throw Error(ErrorKind::kInvalidArgument,
                  what +
                      " is of another job than the tier's state (items, epochs, seed or "
                      "files differ): pass WorkQueue::SaveHostState() of each host of this job");
    auto done = [&](uint64_t t) {
      if (t < s.low) return true;
      uint64_t i = t / 64 - s.low / 64;
      return i < s.words.size() && ((s.words[i] >> (t % 64)) & 1);
    };
    for (uint64_t t = 0; t < s.cursor; ++t) {
      if (!done(t)) continue;
      // A host finishes only tickets the tier handed out, before its state
      // was saved, and so before the tier's.
      if (t >= handed_out)
        throw Error(ErrorKind::kInvalidArgument,
                    what + " has ticket " + std::to_string(t) +
                        " done, which the tier's state has not handed out (cursor " +
                        std::to_string(tier.cursor) +
                        "): save the tier's state after every host's");
      bitmap[t / 8] = static_cast<char>(bitmap[t / 8] | (0x80 >> (t % 8)));
    }
  }
  tier.bitmap = std::move(bitmap);
  return detail::SerializeTierState(std::move(tier));
}

}  // namespace tailcut
