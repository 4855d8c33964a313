// tailcut/work_queue.h: the host-wide work queue.
//
// Every process on a host that opens a WorkQueue with the same name and
// configuration shares one queue in POSIX shared memory. Its options and
// calls follow Alibaba PAI's pai.data.WorkQueue (the "PAI" of this file),
// whose Python interface tailcut's Python package keeps. The queue hands out
// work items (file slices) so that each item is used exactly once per epoch
// across all processes: fast processes take more, slow ones fewer.
//
// Contract
//  * Thread safety: a WorkQueue may be used by many threads of one process at
//    once. Take/TryTake/Ack/GiveBack/Progress are lock-free, noexcept, make no
//    allocation and no system call unless they have to wait (Take at the end
//    of the data) or wake a waiter.
//  * Process safety: any number of processes (up to Options::max_clients) may
//    open the same queue. A process that dies at any point, kill -9 included,
//    loses no items: its open items are handed to others exactly once, found
//    without its help (a robust mutex it holds for its lifetime, not its pid).
//  * Fork: a WorkQueue belongs to the process that opened it; a forked child
//    must open its own. In the child the parent's object is inert: every
//    call returns kForked (SaveState and Stats throw "queue 'q' was opened by
//    process X; this is process Y (a forked child must open its own
//    WorkQueue)"), Close does nothing, and destroying it only unmaps the
//    segment: the parent's client slot, items and segment are untouched. The
//    check is one relaxed load of a counter a pthread_atfork handler bumps:
//    no system call.
//  * Items: an item is taken, then either acked (done), given back (handed
//    out again), or lost with its process (handed out again). An ack for an
//    item that was meanwhile reassigned (lease timeout) is refused: kStale.
//    A second Ack or GiveBack of an item this process already acked or gave
//    back is refused: kAlreadyDone.
//  * End of data: Take returns kEnd once every item of every epoch is acked.
//    While nothing is left to hand out but other live processes hold open
//    items (which come back if they die), Take sleeps (futex) until an item
//    comes back, all are acked, or its deadline passes (kTimeout).
//  * Lifetime: the segment is created by the first process and removed by the
//    last one to close once every epoch is done and at least num_clients
//    processes have joined, or, unfinished, once every process closed it
//    cleanly (unless Options::keep_unfinished). A queue one of whose
//    processes died is kept: the next open with the same configuration
//    resumes it, with a different one replaces it; both say so through
//    Options::on_notice.
//  * Handles: after Close(), every call returns kClosed. Objects built on a
//    queue (a Reader, a Shuffler) hold a WorkQueue::Dependent and must be
//    destroyed before it: destroying a WorkQueue that one still uses aborts
//    the process with a message naming the queue, rather than crashing later
//    at random. A Reader whose queue is closed under it fails with an error
//    that says so. WorkItem::path points into the queue: copy it to keep it
//    past the queue's destruction. Builds without NDEBUG abort with a message
//    on a read of it after the queue was destroyed (tailcut/item_path.h).
//  * Errors: Open/SaveState throw tailcut::Error with a message that names the
//    queue, segment, file or field and what to do.
#ifndef TAILCUT_WORK_QUEUE_H_
#define TAILCUT_WORK_QUEUE_H_

#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tailcut/deadline.h"
#include "tailcut/error.h"
#include "tailcut/export.h"
#include "tailcut/item_path.h"

namespace tailcut {

// Samples per item of an index work when num_slices is unset.
inline constexpr uint64_t kSamplesPerItem = 256;

struct WorkQueueOptions {
  // The options of PAI's WorkQueue (see the top of this file).
  std::vector<std::string> works;  // file paths; prefix is prepended
  // An index work instead of files: N samples (a map-style data set), no
  // file. Items are ranges [begin, end) of positions in the epoch's seeded
  // permutation of 0..N-1 (SampleOrder in tailcut/sample_order.h maps a
  // position to its sample); Progress, Commit, Claim and tail splitting
  // count positions where a file queue counts bytes (min_split_bytes is a
  // number of samples). works and prefix must be empty, format is "index"
  // (set when empty); num_slices unset gives items of about
  // kSamplesPerItem samples.
  uint64_t num_samples = 0;
  // What an index work's samples are, when its user knows more than their
  // number: e.g. the record files they are read from, in order, with their
  // record counts (QueueDataset(shuffle="global") sets it). Fingerprinted as
  // works are: a process, a stale queue or a checkpoint of other samples, as
  // many of them, is refused (kConfigMismatch) rather than read as these.
  // Empty: the samples are known by their number alone. Only with
  // num_samples.
  std::string samples_id;
  uint64_t num_epochs = 1;
  bool shuffle = true;
  std::optional<uint64_t> seed;  // unset: the creator draws one, all use it
  std::string prefix;
  std::optional<uint64_t> num_slices;  // unset: one item per file
  uint32_t num_clients = 1;            // processes expected to join
  std::string name = "work_queue";

  // Fingerprinted tag of how items are read (e.g. "tfrecord"); processes that
  // read the same works differently must not share a queue.
  std::string format;
  uint32_t max_clients = 256;      // client slots in the segment
  uint32_t leases_per_client = 8;  // open items one process may hold
  // How long an attacher waits for the creator to publish the queue.
  std::chrono::milliseconds attach_timeout{10000};
  // A live client that makes no progress (take, ack, Progress) for longer than
  // this has its open items reassigned; its later acks are refused. It decides
  // what processes do to each other, so it is the queue's, not a process's:
  // the creator's value is stored in the segment (0 there: never), and every
  // process uses it. 0 here: use the queue's. Another non-zero value is a
  // kConfigMismatch, except when resuming a stale queue (no live process),
  // which sets it anew. At most 7 days. Others check every 100 ms, or every
  // half timeout if that is shorter.
  std::chrono::milliseconds lease_timeout{0};
  // This process's own items go to the others once the process has not run
  // at all for this long: stopped (SIGSTOP, a debugger, a frozen container)
  // or starved (a swap storm). A thread of the process beats every eighth of
  // it (at least every second), apart from its work, so a process that is
  // only slow (a long transform, a long step) keeps its items; its late
  // calls on a reassigned item return kStale, as after lease_timeout. A
  // process's own choice, unlike lease_timeout: loaders of a pool set it,
  // trainers that hold items across long steps need not. 0: never. At most
  // 7 days.
  std::chrono::milliseconds stop_timeout{0};
  // Tail splitting: a process with nothing left to take splits the unread
  // tail of the open item (or piece) with the most left, and takes it as a
  // new item. Only items whose owner uses Claim, as tailcut's Reader does,
  // are split. Each part is at least min_split_bytes.
  bool split_tail = true;
  uint64_t min_split_bytes = 64 << 10;
  // This process, as a thief, splits at a multiple of this many bytes (an
  // index work: samples) past the item's begin, rounding its split point up
  // (the owner keeps more): a pool loader's batch, so that an item of whole
  // batches splits into pieces of whole batches and no short batch comes of
  // a split. 1: anywhere. At most 2^48-1.
  uint64_t split_multiple = 1;
  // A state from WorkQueue::SaveState(): a newly created queue continues from
  // it. Every process of the job may pass the same state.
  std::string restore_state;
  // Lifetime of an unfinished queue. When its last process closes it cleanly,
  // it is removed, unless some process of it set keep_unfinished (then the
  // next job with the same configuration resumes it), or a process of it
  // died (kept so that a rerun resumes), or fewer than num_clients have
  // joined yet. A finished queue is removed once num_clients have joined.
  bool keep_unfinished = false;
  // Where one-line notices go (resume, replace, waiting). Default: stderr.
  std::function<void(const std::string&)> on_notice;

  // One job across hosts (docs/global.md). With a coordinator, every host
  // keeps its own queue in shared memory, named `name` + "." + host id, and
  // one process per host (elected through it) claims blocks of tickets for
  // it from Redis at this URL: redis://[user[:password]@]HOST:PORT/DB. Empty:
  // TAILCUT_COORDINATOR, and none if that is unset too. Every item is then
  // used exactly once per epoch across all hosts of the job, which is `name`
  // on that Redis. Needs libtailcut_global (built when hiredis is found).
  std::string coordinator;
  // This host's identity in the job; empty: TAILCUT_HOST_ID, else the
  // hostname. Several ids on one machine simulate several hosts.
  std::string host_id;
  // How long a block stays this host's without a renewal. A heartbeat thread
  // of the host's feeder renews its blocks 8 times per TTL, whatever its
  // processes do, so a host paused (SIGSTOP, a GC, a loaded machine) for up
  // to 7/8 of it keeps them; a host that dies, or stops longer, loses its
  // unfinished tickets to the others about this long after (at the default,
  // within 9 s of its death). Longer for hosts that may stall longer, or a
  // Redis whose restarts take longer (docs/global.md, "The timings").
  std::chrono::milliseconds global_ttl{8000};
  // Tickets per block claimed from the coordinator. Larger blocks mean
  // fewer Redis calls, smaller ones a shorter tail between hosts at the end
  // of the data. 0: num_items / 64, at least 1 and at most 64.
  uint64_t global_block_size = 0;
};

// What identifies a work file on this host: taken (stat) by the process that
// created the queue, stored in the segment, and compared by every process
// that attaches and by every Reader that opens the file. A file replaced
// (renamed over), rewritten or resized since differs in one of them.
struct FileIdentity {
  uint64_t size = 0;
  uint64_t mtime_ns = 0;  // last modification, ns since the epoch
  uint64_t inode = 0;
  uint64_t device = 0;
  bool operator==(const FileIdentity&) const = default;
};
// The identity of a stat result.
TAILCUT_EXPORT FileIdentity IdentityOf(const struct ::stat& st) noexcept;
// What changed from `then` to `now`, e.g. "inode 123 -> 456, mtime
// 1700000000.000000001 -> 1700000001.000000000"; "" when they are equal.
TAILCUT_EXPORT std::string DescribeFileChange(const FileIdentity& then, const FileIdentity& now);

// An item one process holds (a lease). Plain data; copy it freely. path points
// into the queue's own table and lives as long as the WorkQueue object: an
// ItemPath, which reads like a std::string_view and, in builds without
// NDEBUG, aborts with a message when read after the queue's destruction.
struct WorkItem {
  uint64_t ticket = 0;  // epoch * num_items + position
  uint64_t epoch = 0;
  uint64_t index = 0;       // item index in [0, num_items): which slice
  uint32_t file = 0;        // index into works (0 in an index work)
  ItemPath path;            // prefix + works[file] ("" in an index work)
  uint64_t begin = 0;       // byte range [begin, end) of the file (of positions
  uint64_t end = 0;         // in an index work); an item handed out again begins
                            // at its floor (see Commit)
  uint32_t lease = 0;       // lease slot, for Ack/GiveBack/Progress
  uint64_t generation = 0;  // lease generation, to refuse stale acks
  bool piece = false;       // a tail split off another process's item
};

enum class TakeStatus {
  kOk,               // *item is valid
  kEnd,              // every item of every epoch is done
  kTimeout,          // nothing to hand out before the deadline; others still hold items
  kLimit,            // this process already holds leases_per_client items: ack or give one back
  kClosed,           // Close() was called on this WorkQueue
  kForked,           // called in a forked child of the process that opened the queue
  kInvalidArgument,  // item is null
  // A queue fed by a coordinator (WorkQueueOptions::coordinator) whose job
  // the coordinator lost (e.g. Redis restarted without persistence): nothing
  // can complete it; JobLossMessage() says what and what to do. Every take
  // in every process of the host answers this from then on.
  kJobLost,
  // The old name of kTimeout, kept for one release.
  kEmpty = kTimeout,
};

enum class StepStatus {
  kAllHaveBatch,  // every rank has a batch for this step: run it
  kEndEpoch,      // some rank has none: every rank ends its epoch before this step
  kTimeout,       // some rank did not arrive before the deadline
  kInvalid,       // rank >= ranks, ranks > max_clients, or a step that went backwards
  kClosed,        // Close() was called on this WorkQueue
  kForked,        // called in a forked child of the process that opened the queue
};

// What the calls about one held item return: Ack, GiveBack, Progress,
// Commit and Claim.
enum class ItemStatus {
  kOk,
  kStale,        // the item was reassigned (lease timeout); the ack was refused
  kInvalid,      // not an item this process took from this queue (e.g. WorkItem{})
  kOutOfRange,   // Progress, Commit: the offset is outside the item's [begin, end], or
                 // (Commit) before an offset committed before; nothing changed
  kAlreadyDone,  // this process already acked or gave back the item; nothing changed
  kClosed,       // Close() was called on this WorkQueue; its items were given back
  kForked,       // called in a forked child of the process that opened the queue
};
// The old name of ItemStatus, kept for one release.
using AckStatus = ItemStatus;

// Short lowercase names, e.g. "already done", "forked", for messages and logs.
TAILCUT_EXPORT const char* TakeStatusName(TakeStatus status) noexcept;
TAILCUT_EXPORT const char* StepStatusName(StepStatus status) noexcept;
TAILCUT_EXPORT const char* ItemStatusName(ItemStatus status) noexcept;
// The old name of ItemStatusName, kept for one release.
inline const char* AckStatusName(ItemStatus status) noexcept { return ItemStatusName(status); }

// Per-client counters, kept in the segment.
struct ClientStats {
  uint32_t slot = 0;
  int32_t pid = 0;
  bool alive = false;
  uint64_t items_taken = 0;
  uint64_t items_acked = 0;
  uint64_t items_given_back = 0;
  uint64_t items_recovered = 0;  // others' items this client recovered
  uint64_t bytes_acked = 0;      // slice bytes of acked items
  uint64_t records = 0;          // reported by readers
  uint64_t stale_acks = 0;
  uint64_t splits = 0;  // tails this client split off others' items
  uint64_t open_items = 0;
  uint64_t busy_ns = 0;           // time registered minus idle time
  uint64_t idle_ns = 0;           // time spent waiting in Take
  uint64_t last_progress_ns = 0;  // CLOCK_MONOTONIC of last take/ack/progress
  uint64_t joined_ns = 0;         // CLOCK_MONOTONIC when it joined
};

struct QueueStats {
  std::string name;
  std::string segment_path;  // e.g. /dev/shm/tailcut.1000.work_queue
  uint64_t num_items = 0;
  uint64_t num_epochs = 0;
  uint64_t num_samples = 0;  // an index work's samples (0: file slices)
  uint64_t total = 0;        // num_items * num_epochs
  uint64_t done = 0;         // acked tickets
  uint64_t in_flight = 0;    // open leases (taken, not acked)
  uint64_t handed_out = 0;   // tickets the cursor has passed
  uint64_t epoch = 0;        // epoch of the next ticket (num_epochs at the end)
  uint64_t seed = 0;
  bool shuffle = false;
  uint32_t num_clients = 0;      // expected
  uint32_t clients_joined = 0;   // ever registered
  uint64_t recovered_items = 0;  // items taken back from dead or hung clients
  uint64_t stale_acks = 0;
  uint64_t splits = 0;               // tails split off slow items
  uint64_t now_ns = 0;               // CLOCK_MONOTONIC when read
  std::vector<ClientStats> clients;  // registered clients (alive or dead)
};

class TAILCUT_EXPORT WorkQueue {
 public:
  // Creates or attaches to the queue named options.name for this user. Stats
  // every work file (missing, unreadable or non-regular files are errors).
  // Throws tailcut::Error.
  static std::unique_ptr<WorkQueue> Open(WorkQueueOptions options);

  // Closes (see Close()). Aborts, naming the queue, while a Dependent of
  // it lives (see Contract: Handles); in a forked child only unmaps.
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Hands out the next item. Waits at the end of the data as described above,
  // at most until deadline. Thread-safe, noexcept.
  TakeStatus Take(WorkItem* item, Deadline deadline = Deadline::max()) noexcept;
  // Take that never waits: kTimeout when nothing can be handed out right now.
  TakeStatus TryTake(WorkItem* item) noexcept;
  // Tail splitting on demand: splits the unclaimed tail off the open item of
  // an epoch below `below_epoch` with the most left (see split_tail), as Take
  // does once it has nothing else to hand out, and hands it out as a piece.
  // For a process that Take hands the next epoch's items while this epoch's
  // last ones are still read elsewhere, and that may not use those yet (a
  // pool loader at an epoch's end): Take then never splits. kOk; kTimeout
  // when no such item has a tail worth splitting (twice min_split_bytes);
  // kClosed, kInvalidArgument (item null), kForked. Never waits,
  // thread-safe, noexcept.
  TakeStatus TakeSplit(WorkItem* item, uint64_t below_epoch) noexcept;

  // Marks a held item done. kStale if it was reassigned meanwhile,
  // kAlreadyDone if this process acked or gave it back before.
  ItemStatus Ack(const WorkItem& item) noexcept;
  // Returns a held item unfinished; another take hands it out again. Same
  // statuses as Ack.
  ItemStatus GiveBack(const WorkItem& item) noexcept;
  // Resume points. An item that leaves its process unfinished (the process
  // dies, gives it back, or loses it to a lease timeout) is handed out again
  // from its floor: where it was handed out, raised by this process's
  // Commit calls, never by Progress (what a process only read or used dies
  // with it). A checkpoint (SaveState) resumes an open item at its floor,
  // raised by this process's Progress calls as long as it never committed
  // the item. Each point only moves forward: a Progress offset below one
  // recorded before is accepted and changes nothing; a Commit offset below
  // the floor (an earlier commit, or where the item was handed out again)
  // is refused with kOutOfRange, since it contradicts what was delivered.
  // The first Commit replaces, for the checkpoint, what this process's
  // Progress said (read is not delivered). docs/reliability.md has the table.
  //
  // Reports progress: this process used the records before `offset` (a
  // checkpoint resumes there, see above) and read `records` more records.
  // Refreshes the lease timeout. kStale if the item was reassigned.
  // kOutOfRange, and nothing recorded, unless begin <= offset <= end (the
  // lease's range as it was first handed out: a record that starts before a
  // split's lower end may end past it), or when the queue's format is
  // fixed-size records ("fixed:N", RecordFormat::Tag) and offset is neither
  // a multiple of N nor the range's begin or end.
  ItemStatus Progress(const WorkItem& item, uint64_t offset, uint64_t records = 0) noexcept;
  // For a process that hands on what it reads to a place that outlives it
  // (a loader publishing batches into a BatchRing): the records before
  // `offset` are delivered. From now on the item resumes at the highest
  // offset committed whatever happens: this process dies, gives it back,
  // loses it to a lease timeout, or a checkpoint is taken (this process's
  // Progress no longer moves the checkpoint: read is not delivered). For
  // every item, claimed (a Reader's) or not: a tail split never takes bytes
  // below a commit, and an item committed to its end is done when it comes
  // back. Call it after each hand-off; a crash between the hand-off and
  // this call repeats what that hand-off held. Same checks and statuses as
  // Progress, and kOutOfRange for an offset below the floor (see above).
  ItemStatus Commit(const WorkItem& item, uint64_t offset) noexcept;

  // Tail splitting, owner side: before handing out records that start
  // before `up_to`, claim them (any up_to: below begin claims nothing, past
  // the end claims up to the end). Sets *end to the item's current end: records
  // starting at or after it belong to a process that split the tail off, so
  // stop there (RecordParser::SetEnd). The first Claim makes the item
  // splittable; an item never claimed is never split. A claim moves no
  // resume point. kStale if the item was reassigned. Lock-free, noexcept,
  // no system call.
  ItemStatus Claim(const WorkItem& item, uint64_t up_to, uint64_t* end) noexcept;

  // Equal steps for synchronous data-parallel trainers (PyTorch DDP needs
  // every rank to run the same number of steps). Ranks 0..ranks-1 of one
  // group each call this once per step, saying whether they have a batch
  // for it; all of them get the same answer. Steps must grow over the
  // queue's lifetime (e.g. epoch << 32 | step in epoch). Sleeps on a futex
  // while others have not arrived, at most until deadline. Thread-safe.
  StepStatus AgreeStep(uint32_t rank, uint32_t ranks, uint64_t step, bool has_batch,
                       Deadline deadline = Deadline::max()) noexcept;

  // Held by an object that uses this queue and must not outlive it (tailcut's
  // Reader holds one): see Contract: Handles. Construct in the process that
  // opened the queue; any thread.
  class TAILCUT_EXPORT Dependent {
   public:
    explicit Dependent(WorkQueue& queue) noexcept;
    ~Dependent();
    Dependent(const Dependent&) = delete;
    Dependent& operator=(const Dependent&) = delete;

   private:
    WorkQueue& queue_;
  };

  // A compact state of the whole queue (cursor, done tickets, open items and
  // their progress) to save with a training checkpoint and pass back through
  // WorkQueueOptions::restore_state. Items open now are handed out again after
  // a restore from their checkpoint resume point (see Progress and Commit).
  // Throws tailcut::Error.
  std::string SaveState() const;
  // A fed queue (a coordinator set): the state of this host's queue alone,
  // as SaveState is on one host (what this host finished, its open items
  // and their resume points). The tier's SaveState marks whole items done,
  // so where a host hands out parts of items (a pooled loader's batches not
  // yet used) only every host's state with the tier's is exact:
  // GlobalStateWithHosts (global_tier.h) and FedRestoreState (below). A queue
  // of one host: SaveState(). Throws tailcut::Error.
  std::string SaveHostState() const;
  // A fed queue: the tier's state, saved now, with its done marks replaced by
  // those of `host_states`, the SaveHostState() of every host of the job,
  // each saved before this call (GlobalStateWithHosts in global_tier.h says
  // what it holds). With each host's own state it restores the job exactly:
  // FedRestoreState. Throws kInvalidArgument on a queue of one host, and
  // as SaveState.
  std::string SaveStateWithHosts(const std::vector<std::string>& host_states) const;

  // Counters of the queue and every client. Safe from any thread.
  QueueStats Stats() const;

  // How far this host's queue is settled: the first ticket at or above
  // `from` that is neither done nor, in a queue fed by a coordinator, another
  // host's, or that still has a piece out (a split tail, an item resumed from
  // a restored state), and below the tickets granted so far (all of them on
  // one host).
  // Epoch e is over here once it reaches (e + 1) * num_items(): on one host
  // when every item of it is done; fed, when this host finished the tickets
  // it holds of it and took one beyond it, or the coordinator has handed out
  // every block. Fed, it can move back when this host re-owns a block of a
  // host that died. 0 once closed (or in a forked child). Lock-free, no
  // system call; reads every lease twice and one word of each bitmap per 64
  // tickets from `from` on. Safe from any thread.
  uint64_t SettledTickets(uint64_t from = 0) const noexcept;

  // After Take answered kJobLost: what the coordinator lost of the job and
  // what to do (names the job and the coordinator's URL without password).
  // "" while the job is not lost. Safe from any thread.
  std::string JobLossMessage() const;

  // Gives back this process's open items, leaves the queue, and removes the
  // segment if this was the last process and the queue is finished. That is
  // decided under the segment's admin lock: a Close that cannot take it
  // within attach_timeout (at least 100 ms) leaves the segment in place and
  // says so through on_notice. Idempotent. Afterwards Take, TryTake, Ack,
  // GiveBack, Progress, Commit, Claim and AgreeStep return kClosed.
  void Close() noexcept;

  const std::string& name() const noexcept;
  // WorkQueueOptions::format as the queue was made with it ("" when none);
  // a Reader refuses to read the queue in another format.
  const std::string& format() const noexcept;
  uint64_t num_items() const noexcept;
  uint64_t num_epochs() const noexcept;
  uint64_t seed() const noexcept;
  bool shuffle() const noexcept;
  // WorkQueueOptions::num_samples of an index work; 0 for a queue of files.
  uint64_t num_samples() const noexcept;
  // The queue's lease timeout, as its segment holds it (0: never); see
  // WorkQueueOptions::lease_timeout.
  std::chrono::milliseconds lease_timeout() const noexcept;
  // The paths (prefix applied) in works order; one empty path in an index
  // work.
  const std::vector<std::string>& paths() const noexcept;
  // Each path's identity when the queue was created, in works order. A
  // reader of a file checks it at every open (see FileIdentity).
  const std::vector<FileIdentity>& files() const noexcept;
  // The item table: item i covers [begin, end) of paths()[file].
  struct Item {
    uint32_t file;
    uint64_t begin;
    uint64_t end;
  };
  const std::vector<Item>& items() const noexcept;
  // The item handed out at `position` of `epoch` (the shuffle bijection).
  uint64_t ItemAt(uint64_t epoch, uint64_t position) const noexcept;

  class Impl;

 private:
  explicit WorkQueue(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Queues of this user, for tools. Each is read without joining it.
struct QueueListing {
  std::string name;
  std::string segment_path;
  bool valid = false;   // false: not a tailcut segment we can read
  std::string problem;  // why not valid
  // Of a valid queue only:
  uint64_t created_unix_ns = 0;   // CLOCK_REALTIME when its creator made it
  bool finished = false;          // every item of every epoch done
  int live_clients = 0;           // processes using it now
  uint64_t lease_timeout_ms = 0;  // the queue's (0: never)
  // Why it stays when its last process closes it unfinished, e.g. "a process
  // of it died, so a rerun resumes it"; "" when it would be removed.
  std::string kept_reason;
};
// The restore_state of one host of a job across hosts from an exact
// checkpoint: `tier_state` the tier's state with every host's
// (GlobalStateWithHosts), `host_state` this host's SaveHostState(), and
// `token` one string the hosts that restore together share (e.g. drawn by
// rank 0 and broadcast). The first host to open creates the tier's job anew
// from it, replacing the run the checkpoint came from (its processes, if any
// are left, stop: the job is another run); the others join. Each host's queue
// resumes its own open items where they were; every ticket no host finished
// or held is handed out again. Pure.
TAILCUT_EXPORT std::string FedRestoreState(const std::string& tier_state,
                                           const std::string& host_state, const std::string& token);

TAILCUT_EXPORT std::vector<QueueListing> ListQueues();
// Stats of an existing queue without joining it. Dead clients found on the way
// are recovered (their items handed back). Throws tailcut::Error (kNotFound,
// kCorrupt, kPermission).
TAILCUT_EXPORT QueueStats InspectQueue(const std::string& name);
// Removes the queue's segment. Refuses (kInvalidArgument, naming the live
// pids) while live clients are registered, unless force. Throws kNotFound.
TAILCUT_EXPORT void RemoveQueue(const std::string& name, bool force);
// The shm object path of a queue name for this user, e.g.
// "/dev/shm/tailcut.1000.work_queue". Throws kInvalidArgument for bad names.
TAILCUT_EXPORT std::string SegmentPath(const std::string& name);

}  // namespace tailcut

#endif  // TAILCUT_WORK_QUEUE_H_
