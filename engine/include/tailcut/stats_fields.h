// tailcut/stats_fields.h: the one list of the fields of ClientStats and
// QueueStats (tailcut/work_queue.h), for everything that shows them: the
// Python dicts (summary(), inspect_queue()), TensorBoard tags (add_summary()),
// the CLI's JSON and the type stubs' checks.
//
// TAILCUT_CLIENT_STATS_FIELDS(X) and TAILCUT_QUEUE_STATS_FIELDS(X) call
//   X(type, name, series, doc)
// once per field, in declaration order: `type` and `name` as declared,
// `series` a StatsSeries (how the field is shown over time), `doc` one line
// on what it counts. QueueStats::clients (a vector of ClientStats) is not in
// the list: it is the list of clients.
//
//   #define PUT(type, name, series, doc) dict[#name] = stats.name;
//   TAILCUT_QUEUE_STATS_FIELDS(PUT)
//   #undef PUT
//
// The static_asserts below compare each struct with one declared from the
// list, member by member, so that a field added to work_queue.h and not here
// (or here and not there) fails to compile.
#ifndef TAILCUT_STATS_FIELDS_H_
#define TAILCUT_STATS_FIELDS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "tailcut/work_queue.h"

namespace tailcut {

// How a stats field is shown as a time series (e.g. a TensorBoard scalar).
enum class StatsSeries {
  kNone,     // identity, configuration or a timestamp: not a series
  kValue,    // the value as it is
  kSeconds,  // a duration in ns, shown in seconds as <name without _ns>_seconds
};

#define TAILCUT_CLIENT_STATS_FIELDS(X)                                                  \
  X(uint32_t, slot, kNone, "the client's slot in the segment")                          \
  X(int32_t, pid, kNone, "the client's process id")                                     \
  X(bool, alive, kValue, "whether the process is alive")                                \
  X(uint64_t, items_taken, kValue, "items it took")                                     \
  X(uint64_t, items_acked, kValue, "items it acked")                                    \
  X(uint64_t, items_given_back, kValue, "items it gave back")                           \
  X(uint64_t, items_recovered, kValue, "others' items it recovered")                    \
  X(uint64_t, bytes_acked, kValue, "slice bytes of the items it acked")                 \
  X(uint64_t, records, kValue, "records its readers reported")                          \
  X(uint64_t, stale_acks, kValue, "its acks refused after a lease timeout")             \
  X(uint64_t, splits, kValue, "tails it split off others' items")                       \
  X(uint64_t, open_items, kValue, "items it holds now")                                 \
  X(uint64_t, busy_ns, kSeconds, "time registered minus idle time")                     \
  X(uint64_t, idle_ns, kSeconds, "time it waited in Take")                              \
  X(uint64_t, last_progress_ns, kNone, "CLOCK_MONOTONIC of its last take/ack/progress") \
  X(uint64_t, joined_ns, kNone, "CLOCK_MONOTONIC when it joined")

#define TAILCUT_QUEUE_STATS_FIELDS(X)                                                \
  X(std::string, name, kNone, "the queue's name")                                    \
  X(std::string, segment_path, kNone, "its shared-memory object")                    \
  X(uint64_t, num_items, kNone, "items per epoch")                                   \
  X(uint64_t, num_epochs, kNone, "epochs")                                           \
  X(uint64_t, num_samples, kNone, "samples of an index work (0: file slices)")       \
  X(uint64_t, total, kValue, "num_items * num_epochs")                               \
  X(uint64_t, done, kValue, "acked tickets")                                         \
  X(uint64_t, in_flight, kValue, "open leases (taken, not acked)")                   \
  X(uint64_t, handed_out, kValue, "tickets the cursor has passed")                   \
  X(uint64_t, epoch, kValue, "epoch of the next ticket (num_epochs at the end)")     \
  X(uint64_t, seed, kNone, "the shuffle seed")                                       \
  X(bool, shuffle, kNone, "whether items are shuffled")                              \
  X(uint32_t, num_clients, kNone, "clients expected")                                \
  X(uint32_t, clients_joined, kValue, "clients ever registered")                     \
  X(uint64_t, recovered_items, kValue, "items taken back from dead or hung clients") \
  X(uint64_t, stale_acks, kValue, "acks refused after a lease timeout")              \
  X(uint64_t, splits, kValue, "tails split off slow items")                          \
  X(uint64_t, now_ns, kNone, "CLOCK_MONOTONIC when the stats were read")

namespace detail {

#define TAILCUT_STATS_MEMBER(type, name, series, doc) type name;
struct ClientStatsFromList {
  TAILCUT_CLIENT_STATS_FIELDS(TAILCUT_STATS_MEMBER)
};
struct QueueStatsFromList {
  TAILCUT_QUEUE_STATS_FIELDS(TAILCUT_STATS_MEMBER)
  std::vector<ClientStats> clients;
};
#undef TAILCUT_STATS_MEMBER

#define TAILCUT_STATS_SAME_MEMBER(type, name, series, doc)                         \
  static_assert(std::is_same_v<decltype(Stats::name), decltype(FromList::name)> && \
                    offsetof(Stats, name) == offsetof(FromList, name),             \
                "tailcut/stats_fields.h: field '" #name "' differs from tailcut/work_queue.h");

template <typename Stats, typename FromList>
constexpr bool SameSize() {
  return sizeof(Stats) == sizeof(FromList);
}

// offsetof of a non-standard-layout class (QueueStats holds a std::string)
// is conditionally supported; GCC and Clang support it and warn.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
namespace client_check {
using Stats = ClientStats;
using FromList = ClientStatsFromList;
TAILCUT_CLIENT_STATS_FIELDS(TAILCUT_STATS_SAME_MEMBER)
static_assert(SameSize<Stats, FromList>(),
              "tailcut/stats_fields.h: ClientStats has fields the list does not name");
}  // namespace client_check
namespace queue_check {
using Stats = QueueStats;
using FromList = QueueStatsFromList;
TAILCUT_QUEUE_STATS_FIELDS(TAILCUT_STATS_SAME_MEMBER)
static_assert(offsetof(Stats, clients) == offsetof(FromList, clients) &&
                  SameSize<Stats, FromList>(),
              "tailcut/stats_fields.h: QueueStats has fields the list does not name");
}  // namespace queue_check
#pragma GCC diagnostic pop
#undef TAILCUT_STATS_SAME_MEMBER

}  // namespace detail
}  // namespace tailcut

#endif  // TAILCUT_STATS_FIELDS_H_
