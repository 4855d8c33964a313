// io/cuda_host.h: registering host memory with a CUDA runtime loaded at run
// time, so that host-to-device copies from it are DMA.
//
// tailcut has no build dependency on CUDA: the runtime (libcudart) is found
// with dlopen when a registration is asked for, or named by TAILCUT_CUDART
// (tests and odd installs). Its handle is never closed: unloading a CUDA
// runtime is not safe. Used by the Reader's chunk arena (buffer_arena.h) and
// by a trainer's mapping of a batch ring's arena (pool/batch_ring.cc).
//
// A CudaHostRegistration is not thread-safe and belongs to the owner of the
// memory, which must keep the range mapped until it is destroyed.
#ifndef TAILCUT_IO_CUDA_HOST_H_
#define TAILCUT_IO_CUDA_HOST_H_

#include <cstdint>
#include <string>

namespace tailcut::detail {

class CudaHostRegistration {
 public:
  // Registers [base, base + bytes) (cudaHostRegister, portable to every
  // context) when a runtime can be loaded and reports a device. Never throws
  // for CUDA's sake: a failure is kept in problem().
  CudaHostRegistration(void* base, uint64_t bytes);
  // cudaHostUnregister, when registered. REQUIRES: the range is still mapped.
  ~CudaHostRegistration();
  CudaHostRegistration(const CudaHostRegistration&) = delete;
  CudaHostRegistration& operator=(const CudaHostRegistration&) = delete;

  bool pinned() const noexcept { return unregister_ != nullptr; }
  // Why the range is not pinned, e.g. "no CUDA device (cudaGetDeviceCount:
  // CUDA error 35 (...))" or "cudaHostRegister failed: CUDA error 2 (...)";
  // empty when pinned.
  const std::string& problem() const noexcept { return problem_; }
  // The host has no GPU to pin for (no runtime and no NVIDIA driver, or a
  // runtime that finds no driver or device): normal on a CPU-only host, so
  // callers stay silent about it and only say why when asked. False when a
  // GPU is there and registration failed anyway, which is worth a notice.
  bool no_gpu() const noexcept { return no_gpu_; }

 private:
  void* base_ = nullptr;
  void* unregister_ = nullptr;  // cudaHostUnregister, when pinned
  std::string problem_;
  bool no_gpu_ = false;
};

}  // namespace tailcut::detail

#endif  // TAILCUT_IO_CUDA_HOST_H_
