// tailcut/item_path.h: WorkItem::path, a view of a work file's path that
// knows which queue it points into.
//
// Contract
//  * An ItemPath handed out by WorkQueue::Take points into that queue's own
//    table of paths: it is valid while the WorkQueue object lives (Close()
//    does not end it; destruction does). Copy it (std::string(item.path)) to
//    keep it longer.
//  * Builds without NDEBUG check every read (view(), the conversion to
//    std::string_view, data(), size(), ...): a read after the queue was
//    destroyed aborts the process with a message saying so, instead of
//    reading freed memory. The check is one relaxed load of a process-wide
//    table slot, and it lives in this header, so it follows the NDEBUG of the
//    code that reads the path, not the library's. Builds with NDEBUG check
//    nothing. Either way Take stores 16 bytes, as many as a std::string_view
//    took: a pointer, a 32-bit length and the queue's 32-bit token.
//  * An ItemPath made from a std::string_view (WorkItem{}, tests, a caller's
//    own items) is never checked: it does not belong to a queue.
//  * Thread safety: like std::string_view (read from any thread). The check
//    sees a destruction that happens-before the read; a read racing with the
//    queue's destruction is a data race on the queue, which no check makes
//    safe.
//  * A process opens at most 4,095 checked queues at once (further ones hand
//    out unchecked paths), and generations have 20 bits: a read through a
//    destroyed queue passes if its slot now holds a queue opened 2^20 (or a
//    multiple) openings later. Paths are shorter than 4 GiB.
#ifndef TAILCUT_ITEM_PATH_H_
#define TAILCUT_ITEM_PATH_H_

#include <cstdint>
#include <ostream>
#include <string_view>
#include <type_traits>

#include "tailcut/export.h"

namespace tailcut {

namespace detail {
// Aborts with "tailcut: WorkItem::path read after its WorkQueue was
// destroyed ..." when the queue of `queue_token` is gone. Token 0: no queue.
TAILCUT_EXPORT void CheckItemPath(uint32_t queue_token) noexcept;
}  // namespace detail

class ItemPath {
 public:
  constexpr ItemPath() noexcept = default;
  // An unchecked path (no queue), from anything a std::string_view is made
  // from (a std::string, a C string): it views that, as a string_view would.
  constexpr ItemPath(std::string_view path) noexcept  // NOLINT: as a string_view
      : data_(path.data()), size_(static_cast<uint32_t>(path.size())) {}
  template <typename T, typename = std::enable_if_t<
                            std::is_convertible_v<const T&, std::string_view> &&
                            !std::is_same_v<T, std::string_view> && !std::is_same_v<T, ItemPath>>>
  constexpr ItemPath(const T& path) noexcept  // NOLINT: as a string_view
      : ItemPath(std::string_view(path)) {}
  // A queue's path. For the library: queue_token names the queue's slot in
  // the process-wide table the check reads.
  static constexpr ItemPath OfQueue(std::string_view path, uint32_t queue_token) noexcept {
    ItemPath p(path);
    p.queue_token_ = queue_token;
    return p;
  }

  std::string_view view() const noexcept {
#ifndef NDEBUG
    if (queue_token_ != 0) detail::CheckItemPath(queue_token_);
#endif
    return std::string_view(data_, size_);
  }
  operator std::string_view() const noexcept { return view(); }  // NOLINT: as a string_view
  const char* data() const noexcept { return view().data(); }
  size_t size() const noexcept { return view().size(); }
  bool empty() const noexcept { return view().empty(); }
  std::string_view::const_iterator begin() const noexcept { return view().begin(); }
  std::string_view::const_iterator end() const noexcept { return view().end(); }

  // Also ItemPath == ItemPath (C++20 prefers this over its reversed form).
  friend bool operator==(const ItemPath& a, std::string_view b) noexcept { return a.view() == b; }
  friend std::ostream& operator<<(std::ostream& os, const ItemPath& p) { return os << p.view(); }

 private:
  const char* data_ = "";
  uint32_t size_ = 0;
  uint32_t queue_token_ = 0;  // 0: not a queue's; else slot << 20 | generation
};

}  // namespace tailcut

#endif  // TAILCUT_ITEM_PATH_H_
