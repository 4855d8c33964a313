// WorkItem: one item this process holds, as Python sees it, and the blocking
// calls that hand items out (take, agree_step).
//
// A PyWorkItem is used by one Python thread at a time (the GIL); its state
// tells which of ack / give_back / progress may still be called.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <string>

#include "conversions.h"
#include "errors.h"
#include "queue.h"

namespace tailcut::python {

enum class ItemState { kOpen, kAcked, kGivenBack, kStale };

inline const char* StateName(ItemState s) {
  switch (s) {
    case ItemState::kOpen:
      return "open";
    case ItemState::kAcked:
      return "acked";
    case ItemState::kGivenBack:
      return "given_back";
    case ItemState::kStale:
      return "stale";
  }
  return "?";
}

struct PyWorkItem {
  HandlePtr h;
  tc::WorkItem item;
  std::string path;
  ItemState state = ItemState::kOpen;
  // The highest offset committed through this object, or where the item was
  // handed out (its floor then).
  uint64_t committed_at = 0;

  PyWorkItem(HandlePtr handle, const tc::WorkItem& it)
      : h(std::move(handle)), item(it), path(it.path), committed_at(it.begin) {
    item.path = {};
  }
  // An item dropped while open (garbage-collected, never acked or given
  // back) goes back to the queue now, not at close(), so another process can
  // take it; with auto_ack it counts as done instead. A forked child leaves
  // its parent's items alone.
  ~PyWorkItem() {
    if (state != ItemState::kOpen || ::getpid() != h->pid) return;
    if (h->auto_ack) {
      AckQuietly();
    } else {
      GiveBackQuietly();
    }
  }
  PyWorkItem(const PyWorkItem&) = delete;
  PyWorkItem& operator=(const PyWorkItem&) = delete;

  std::string Describe() const {
    std::string range = "[" + std::to_string(item.begin) + ", " + std::to_string(item.end) + ")";
    return "item " + std::to_string(item.index) + " (epoch " + std::to_string(item.epoch) + ", " +
           (h->queue->num_samples() != 0 ? "positions " + range : "'" + path + "' " + range) +
           ") of queue '" + h->name + "'";
  }
  void RequireOpen(const char* action) const {
    if (state != ItemState::kOpen)
      Raise(g_exc.invalid_argument, std::string("cannot ") + action + " " + Describe() +
                                        ": it is already " + StateName(state));
  }
  // offset: the one Progress or Commit was given, to say why it was refused.
  void Check(tc::ItemStatus status, const char* action, uint64_t offset = 0) {
    if (status == tc::ItemStatus::kOk) return;
    if (status == tc::ItemStatus::kStale) {
      state = ItemState::kStale;
      Raise(g_exc.stale, std::string(action) + " of " + Describe() +
                             " refused: the item was reassigned to another process after a lease "
                             "timeout (its records may be read twice); stop reading it");
    }
    if (status == tc::ItemStatus::kAlreadyDone)
      Raise(g_exc.invalid_argument, std::string(action) + " of " + Describe() +
                                        " refused: this process already acked or gave it back");
    if (status == tc::ItemStatus::kClosed) throw h->ClosedError();
    if (status == tc::ItemStatus::kForked) h->CheckPid();
    if (status == tc::ItemStatus::kOutOfRange && h->format &&
        h->format->kind == tc::RecordFormatKind::kFixed && offset >= item.begin &&
        offset <= item.end)
      Raise(g_exc.invalid_argument,
            std::string(action) + " of " + Describe() + " refused: offset " +
                std::to_string(offset) + " is inside a record (format '" + h->format->Tag() +
                "': records start at multiples of " + std::to_string(h->format->record_bytes) +
                "); nothing was recorded");
    if (status == tc::ItemStatus::kOutOfRange)
      Raise(g_exc.invalid_argument, std::string(action) + " of " + Describe() +
                                        " refused: the offset is outside the item's byte range "
                                        "(begin <= offset <= end); nothing was recorded");
    Raise(g_exc.invalid_argument, std::string(action) + " of " + Describe() +
                                      " refused: not an open item of this queue and process");
  }
  void Ack() {
    RequireOpen("ack");
    tc::ItemStatus s;
    {
      Use use(*h);
      s = h->queue->Ack(item);
    }
    Check(s, "ack");
    state = ItemState::kAcked;
  }
  void GiveBack() {
    RequireOpen("give back");
    tc::ItemStatus s;
    {
      Use use(*h);
      s = h->queue->GiveBack(item);
    }
    Check(s, "give_back");
    state = ItemState::kGivenBack;
  }
  void Progress(const py::object& offset, const py::object& records) {
    RequireOpen("report progress of");
    uint64_t off = ToU64(offset, "offset");
    uint64_t recs = ToU64(records, "records");
    tc::ItemStatus s;
    {
      Use use(*h);
      s = h->queue->Progress(item, off, recs);
    }
    Check(s, "progress", off);
  }
  void Commit(const py::object& offset) {
    RequireOpen("commit");
    uint64_t off = ToU64(offset, "offset");
    // The engine refuses it too (kOutOfRange); here the message can name
    // both offsets. Only this object commits its lease, so committed_at is
    // the lease's floor.
    if (off < committed_at)
      Raise(
          g_exc.invalid_argument,
          "commit(" + std::to_string(off) + ") of " + Describe() + " refused: offset " +
              std::to_string(off) + " is before " + std::to_string(committed_at) + ", " +
              (committed_at == item.begin ? "where the item was handed out" : "committed before") +
              "; commits only move forward (what is committed is delivered and never read "
              "again); nothing was recorded");
    tc::ItemStatus s;
    {
      Use use(*h);
      s = h->queue->Commit(item, off);
    }
    Check(s, "commit", off);
    committed_at = off;
  }
  // WorkQueue::Claim: returns the item's current end (a tail split off
  // lowers it).
  uint64_t Claim(const py::object& up_to) {
    RequireOpen("claim");
    uint64_t to = ToU64(up_to, "up_to");
    uint64_t end = 0;
    tc::AckStatus s;
    {
      Use use(*h);
      s = h->queue->Claim(item, to, &end);
    }
    Check(s, "claim");
    return end;
  }
  // Best effort, for destructors: no raise.
  void AckQuietly() noexcept {
    if (state != ItemState::kOpen) return;
    try {
      Use use(*h);
      h->queue->Ack(item);
    } catch (...) {
    }
    state = ItemState::kAcked;
  }
  // Best effort, for destructors and __exit__ with an exception: no raise.
  void GiveBackQuietly() noexcept {
    if (state != ItemState::kOpen) return;
    try {
      Use use(*h);
      h->queue->GiveBack(item);
    } catch (...) {
    }
    state = ItemState::kGivenBack;
  }
};

using ItemPtr = std::shared_ptr<PyWorkItem>;

// Blocking take in slices; nullopt at the end of the data. REQUIRES: the GIL.
std::optional<tc::WorkItem> TakeBlocking(QueueHandle& h, const py::object& timeout);

// auto_ack: acks the item handed out last through `last` if it is still
// open, before the next one is taken. Raises StaleItemError if it was
// reassigned meanwhile. REQUIRES: the GIL (which guards `last`).
void AckPrevious(std::weak_ptr<PyWorkItem>& last);
// What take() and input_producer().get() raise (InvalidArgumentError) when
// this process holds leases_per_client items: waiting could wait for itself.
[[noreturn]] void RaiseLeaseLimit(const QueueHandle& h);

}  // namespace tailcut::python
