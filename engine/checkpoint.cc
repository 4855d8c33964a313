#include "engine/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <map>
#include <string_view>
#include <tuple>
#include <utility>

#include "engine/config.h"
#include "tailcut/error.h"

namespace tailcut::detail {

// Checkpoint state, serialised little-endian:
//   magic, version, data fingerprint, items, epochs, seed, low, cursor,
//   done words from low/64 up to the cursor, pieces (ticket, begin, end),
//   and a hash of everything before it.
constexpr uint64_t kStateMagic = 0x3145544154534354ull;  // "TCSTATE1"
constexpr uint64_t kStateVersion = 1;

namespace {

// Throws kInvalidArgument for a range that is empty or past the checkpoint's
// tickets; `what` says what the caller does with the ranges.
void CheckRanges(const std::string& name, const SavedState& s, const std::vector<Piece>& ranges,
                 const char* what) {
  const uint64_t total = s.num_items * s.num_epochs;  // DeserializeState checked the product
  for (const Piece& r : ranges) {
    if (r.begin < r.end && r.ticket < total) continue;
    throw Error(
        ErrorKind::kInvalidArgument,
        "queue '" + name + "': cannot " + what + " range (ticket " + std::to_string(r.ticket) +
            ", begin " + std::to_string(r.begin) + ", end " + std::to_string(r.end) + "): " +
            (r.begin >= r.end ? "begin must be below end"
                              : "the checkpoint has tickets 0.." + std::to_string(total - 1)) +
            "; pass the (ticket, begin, end) ranges of records taken from this queue");
  }
}

void Put(std::string* out, uint64_t v) { out->append(reinterpret_cast<const char*>(&v), 8); }

}  // namespace

std::string SerializeState(const SavedState& s) {
  std::string out;
  for (uint64_t v : {kStateMagic, kStateVersion, s.fingerprint, s.num_items, s.num_epochs, s.seed,
                     s.low, s.cursor, static_cast<uint64_t>(s.words.size())})
    Put(&out, v);
  for (uint64_t w : s.words) Put(&out, w);
  Put(&out, s.pieces.size());
  for (const Piece& p : s.pieces) {
    Put(&out, p.ticket);
    Put(&out, p.begin);
    Put(&out, p.end);
  }
  Put(&out, HashBytes(out.data(), out.size()));
  return out;
}

SavedState DeserializeState(const std::string& name, const std::string& bytes) {
  auto corrupt = [&](const std::string& what) {
    return Error(ErrorKind::kCorrupt, "queue '" + name +
                                          "': restore_state is not a valid tailcut "
                                          "checkpoint (" +
                                          what + "); pass the bytes SaveState() returned");
  };
  size_t pos = 0;
  auto get = [&]() {
    if (bytes.size() - pos < 8) throw corrupt("truncated at byte " + std::to_string(pos));
    uint64_t v;
    std::memcpy(&v, bytes.data() + pos, 8);
    pos += 8;
    return v;
  };
  if (bytes.size() < 8 * 11 || bytes.size() % 8 != 0)
    throw corrupt(std::to_string(bytes.size()) + " bytes");
  uint64_t stored_hash;
  std::memcpy(&stored_hash, bytes.data() + bytes.size() - 8, 8);
  if (get() != kStateMagic) throw corrupt("bad magic");
  if (uint64_t v = get(); v != kStateVersion) throw corrupt("version " + std::to_string(v));
  if (HashBytes(bytes.data(), bytes.size() - 8) != stored_hash) throw corrupt("checksum mismatch");
  SavedState s;
  s.fingerprint = get();
  s.num_items = get();
  s.num_epochs = get();
  s.seed = get();
  s.low = get();
  s.cursor = get();
  uint64_t nwords = get();
  if (nwords > bytes.size() / 8) throw corrupt("word count out of range");
  s.words.resize(nwords);
  for (auto& w : s.words) w = get();
  uint64_t npieces = get();
  if (npieces > bytes.size() / 24) throw corrupt("piece count out of range");
  s.pieces.resize(npieces);
  for (auto& p : s.pieces) p = {get(), get(), get()};
  if (pos + 8 != bytes.size()) throw corrupt("trailing bytes");
  uint64_t total = s.num_items * s.num_epochs;
  if (s.num_items == 0 || s.num_epochs == 0 || total / s.num_epochs != s.num_items ||
      s.low > s.cursor || s.cursor > total || nwords != (s.cursor + 63) / 64 - s.low / 64)
    throw corrupt("inconsistent counts");
  for (const Piece& p : s.pieces)
    if (p.ticket >= total || p.begin > p.end) throw corrupt("piece out of range");
  return s;
}

Reopened ReopenRanges(const std::string& name, const std::string& bytes,
                      const std::vector<Piece>& ranges) {
  SavedState s = DeserializeState(name, bytes);
  CheckRanges(name, s, ranges, "reopen");
  std::vector<Piece> sorted = ranges;
  auto key = [](const Piece& p) { return std::tie(p.ticket, p.begin, p.end); };
  std::sort(sorted.begin(), sorted.end(),
            [&](const Piece& a, const Piece& b) { return key(a) < key(b); });
  sorted.erase(std::unique(sorted.begin(), sorted.end(),
                           [&](const Piece& a, const Piece& b) { return key(a) == key(b); }),
               sorted.end());

  // What a restored queue reads anyway: the open pieces, and the ranges
  // added below, per ticket.
  std::map<uint64_t, std::vector<std::pair<uint64_t, uint64_t>>> covered;
  for (const Piece& p : s.pieces) covered[p.ticket].emplace_back(p.begin, p.end);
  const uint64_t first = s.low / 64 * 64;  // the ticket of the first done bit
  Reopened out;
  for (Piece r : sorted) {
    if (r.ticket >= s.cursor) continue;  // never handed out: read whole after a restore
    const uint64_t bit = r.ticket - first;
    const bool done = r.ticket < first || (s.words[bit / 64] >> (bit % 64) & 1) != 0;
    auto open = covered.find(r.ticket);
    if (!done && open == covered.end()) continue;  // neither: handed out whole again
    if (open != covered.end()) {
      std::sort(open->second.begin(), open->second.end());
      for (const auto& [lo, hi] : open->second) {
        if (lo <= r.begin && r.begin < hi)
          r.begin = hi;
        else if (r.begin < lo && lo < r.end)
          r.end = lo;
      }
    }
    if (r.begin >= r.end) continue;
    covered[r.ticket].emplace_back(r.begin, r.end);
    s.pieces.push_back(r);
    ++out.ranges;
  }
  out.state = SerializeState(s);
  return out;
}

std::string ConsumeRanges(const std::string& name, const std::string& bytes,
                          const std::vector<Piece>& ranges) {
  SavedState s = DeserializeState(name, bytes);
  CheckRanges(name, s, ranges, "consume");
  std::vector<Piece> pieces = std::move(s.pieces);
  for (const Piece& r : ranges) {
    std::vector<Piece> cut;
    for (const Piece& p : pieces) {
      if (p.ticket != r.ticket || r.end <= p.begin || p.end <= r.begin) {
        cut.push_back(p);
        continue;
      }
      if (p.begin < r.begin) cut.push_back({p.ticket, p.begin, r.begin});
      if (r.end < p.end) cut.push_back({p.ticket, r.end, p.end});
      // Cut away entirely: an empty piece, which a restore takes as its
      // ticket consumed to the end (done), whatever the ticket's bit says.
      if (r.begin <= p.begin && p.end <= r.end) cut.push_back({p.ticket, p.end, p.end});
    }
    pieces = std::move(cut);
  }
  s.pieces = std::move(pieces);
  return SerializeState(s);
}

std::string MergeStates(const std::string& name, const std::vector<std::string>& states) {
  if (states.empty())
    throw Error(ErrorKind::kInvalidArgument,
                "queue '" + name + "': no checkpoint to merge: pass the host states to join");
  if (states.size() == 1) {
    DeserializeState(name, states[0]);  // refused as any restore_state would be
    return states[0];
  }
  std::vector<SavedState> saved;
  for (const std::string& bytes : states) saved.push_back(DeserializeState(name, bytes));
  SavedState out = saved[0];
  out.cursor = 0;
  for (size_t i = 0; i < saved.size(); ++i) {
    const SavedState& s = saved[i];
    if (s.fingerprint != out.fingerprint || s.num_items != out.num_items ||
        s.num_epochs != out.num_epochs || s.seed != out.seed)
      throw Error(ErrorKind::kInvalidArgument,
                  "queue '" + name + "': checkpoint " + std::to_string(i) +
                      " of the host states to merge is of another job than checkpoint 0 (data, "
                      "items, epochs or seed differ): merge only the host states of one job");
    out.cursor = std::max(out.cursor, s.cursor);
  }
  std::vector<uint64_t> bits((out.cursor + 63) / 64);
  auto set = [&](uint64_t t) { bits[t / 64] |= uint64_t{1} << (t % 64); };
  std::vector<Piece> pieces;
  for (const SavedState& s : saved) {
    for (uint64_t i = 0; i < s.low / 64; ++i) bits[i] = ~uint64_t{0};
    for (uint64_t t = s.low / 64 * 64; t < s.low; ++t) set(t);
    for (uint64_t i = 0; i < s.words.size(); ++i) {
      uint64_t w = s.words[i];
      // Bits past a state's cursor mean nothing (ApplyRestore drops them too).
      if (i + 1 == s.words.size() && s.cursor % 64 != 0) w &= (uint64_t{1} << (s.cursor % 64)) - 1;
      bits[s.low / 64 + i] |= w;
    }
    // Pieces at or past a state's cursor mean nothing there (ApplyRestore).
    for (const Piece& p : s.pieces) {
      if (p.ticket >= s.cursor) continue;
      set(p.ticket);
      if (p.begin < p.end) pieces.push_back(p);  // an empty one only marks its ticket done
    }
  }
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) {
    return std::tie(a.ticket, a.begin, a.end) < std::tie(b.ticket, b.begin, b.end);
  });
  out.pieces.clear();
  for (const Piece& p : pieces) {
    Piece* last = out.pieces.empty() ? nullptr : &out.pieces.back();
    if (last != nullptr && last->ticket == p.ticket && p.begin <= last->end)
      last->end = std::max(last->end, p.end);
    else
      out.pieces.push_back(p);
  }
  out.low = 0;
  while (out.low < out.cursor && ((bits[out.low / 64] >> (out.low % 64)) & 1)) ++out.low;
  out.words.assign(bits.begin() + static_cast<long>(out.low / 64), bits.end());
  return SerializeState(out);
}

uint64_t LowestOpenPiece(const SavedState& s) {
  uint64_t low = UINT64_MAX;
  for (const Piece& p : s.pieces)
    if (p.begin < p.end && p.ticket < s.cursor) low = std::min(low, p.ticket);
  return low;
}

std::string EmptyState(const std::string& name, const std::string& like) {
  const SavedState s = DeserializeState(name, like);
  return SerializeState({.fingerprint = s.fingerprint,
                         .num_items = s.num_items,
                         .num_epochs = s.num_epochs,
                         .seed = s.seed});
}

namespace {

constexpr std::string_view kFedMagic = "tailcut-fed-restore 1";

}  // namespace

bool IsFedRestore(const std::string& bytes) { return bytes.rfind(kFedMagic, 0) == 0; }

std::string SerializeFedRestore(const FedRestore& r) {
  std::string out(kFedMagic);
  for (const std::string* part : {&r.token, &r.tier, &r.host})
    out += " " + std::to_string(part->size());
  return out + "\n" + r.token + r.tier + r.host;
}

FedRestore DeserializeFedRestore(const std::string& name, const std::string& bytes) {
  auto corrupt = [&](const std::string& what) {
    return Error(ErrorKind::kCorrupt, "queue '" + name +
                                          "': restore_state is not a checkpoint of a job across "
                                          "hosts (" +
                                          what + "); pass the bytes FedRestoreState() returned");
  };
  size_t newline = bytes.find('\n');
  if (!IsFedRestore(bytes) || newline == std::string::npos) throw corrupt("no header");
  uint64_t sizes[3];
  const char* p = bytes.data() + kFedMagic.size();
  const char* end = bytes.data() + newline;
  for (uint64_t& size : sizes) {
    if (p >= end || *p != ' ') throw corrupt("header fields missing");
    auto [next, ec] = std::from_chars(p + 1, end, size);
    if (ec != std::errc()) throw corrupt("a header field is not a number");
    p = next;
  }
  const uint64_t body = bytes.size() - newline - 1;
  if (p != end || sizes[0] > body || sizes[1] > body - sizes[0] ||
      sizes[2] != body - sizes[0] - sizes[1])
    throw corrupt("its length does not match its header");
  FedRestore r;
  r.token = bytes.substr(newline + 1, sizes[0]);
  r.tier = bytes.substr(newline + 1 + sizes[0], sizes[1]);
  r.host = bytes.substr(newline + 1 + sizes[0] + sizes[1]);
  return r;
}

}  // namespace tailcut::detail
