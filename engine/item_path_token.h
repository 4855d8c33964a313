// A WorkQueue's slot in the process-wide table that ItemPath's debug check
// reads (tailcut/item_path.h): taken when the queue object is made, freed
// when it is destroyed, so that a path read afterwards finds its slot
// changed.
//
//  * Each of the kSlots - 1 slots holds 0 (free) or the 20-bit generation of
//    the queue in it; a token is slot << 20 | generation. Taking a slot is a
//    CAS from 0, freeing it a store of 0: no lock, so a forked child never
//    inherits one held.
//  * With every slot taken, a queue gets token 0: its paths go unchecked.
#ifndef TAILCUT_ENGINE_ITEM_PATH_TOKEN_H_
#define TAILCUT_ENGINE_ITEM_PATH_TOKEN_H_

#include <cstdint>

namespace tailcut::detail {

class ItemPathToken {
 public:
  ItemPathToken() noexcept;
  ~ItemPathToken();
  ItemPathToken(const ItemPathToken&) = delete;
  ItemPathToken& operator=(const ItemPathToken&) = delete;

  uint32_t value() const noexcept { return token_; }

 private:
  uint32_t token_;
};

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_ITEM_PATH_TOKEN_H_
