// io/buffer_arena.h: the Reader's chunk memory and its carry buffer.
//
// BufferArena: one anonymous mapping of the buffer budget, split into equal
// chunks. It is locked in memory (mlock) when RLIMIT_MEMLOCK or CAP_IPC_LOCK
// allows, excluded from fork (MADV_DONTFORK), and registered with the CUDA
// runtime when one can be loaded at run time and has a device. The I/O
// backend registers it with io_uring on its own (it owns the ring).
//
// Ownership of a chunk (tracked by the Reader, not here): free in the pool ->
// a read in flight (the kernel or a pread worker writes it) -> ready in its
// item's queue -> the consumer's window -> free again when the consumer moves
// past it (records handed out from it stay valid until the next Next* call).
//
// CarryBuffer: a reservation of address space (MAP_NORESERVE) for joining a
// record that crosses chunk boundaries. Only the bytes used are touched;
// after a large record the pages beyond a small floor are returned.
//
// Neither class is thread-safe; both belong to one Reader.
#ifndef TAILCUT_IO_BUFFER_ARENA_H_
#define TAILCUT_IO_BUFFER_ARENA_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "io/cuda_host.h"

namespace tailcut::detail {

// "64 MiB", "4 KiB", "1.5 GiB", "100 bytes".
std::string FormatBytes(uint64_t bytes);

class BufferArena {
 public:
  // Maps and locks chunk_bytes * num_chunks bytes (chunk_bytes a multiple of
  // the page size). Throws tailcut::Error(kNoSpace) when the mapping fails.
  // `notice` receives one line when locking fails (naming RLIMIT_MEMLOCK and
  // how to raise it) and, once per process, when an NVIDIA GPU is there but
  // the arena cannot be registered with it. A host without a GPU (no runtime,
  // or a runtime that finds no driver or device) gets no notice; Describe()
  // says why the arena is not CUDA-pinned.
  BufferArena(uint64_t chunk_bytes, uint32_t num_chunks, bool cuda_register,
              const std::function<void(const std::string&)>& notice);
  ~BufferArena();
  BufferArena(const BufferArena&) = delete;
  BufferArena& operator=(const BufferArena&) = delete;

  std::byte* data() const noexcept { return base_; }
  uint64_t size() const noexcept { return size_; }
  std::byte* chunk(uint32_t index) const noexcept { return base_ + uint64_t{index} * chunk_bytes_; }
  uint64_t chunk_bytes() const noexcept { return chunk_bytes_; }

  bool locked() const noexcept { return locked_; }
  bool cuda_pinned() const noexcept { return cuda_pinned_; }
  // One line for Reader::memory_state(); `registered` says whether the I/O
  // backend registered the arena with io_uring.
  std::string Describe(bool registered, bool uring) const;

 private:
  std::byte* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t chunk_bytes_ = 0;
  bool locked_ = false;
  int lock_errno_ = 0;
  uint64_t memlock_limit_ = 0;  // RLIM_INFINITY as UINT64_MAX
  bool cuda_pinned_ = false;
  std::string cuda_state_;  // why not pinned, when registration was tried
  std::unique_ptr<CudaHostRegistration> cuda_;
};

class CarryBuffer {
 public:
  // Reserves capacity bytes of address space; throws Error(kNoSpace).
  explicit CarryBuffer(uint64_t capacity);
  ~CarryBuffer();
  CarryBuffer(const CarryBuffer&) = delete;
  CarryBuffer& operator=(const CarryBuffer&) = delete;

  std::byte* data() const noexcept { return base_; }
  uint64_t capacity() const noexcept { return capacity_; }
  // Notes that bytes up to `used` were touched; Trim() returns the pages
  // beyond a small floor once a large record is done.
  void Touch(uint64_t used) noexcept {
    if (used > high_water_) high_water_ = used;
  }
  void Trim() noexcept;

 private:
  std::byte* base_ = nullptr;
  uint64_t capacity_ = 0;
  uint64_t high_water_ = 0;
};

}  // namespace tailcut::detail

#endif  // TAILCUT_IO_BUFFER_ARENA_H_
