#include "engine/process_owner.h"

#include <pthread.h>
#include <unistd.h>

#include "tailcut/error.h"

namespace tailcut::detail {

std::atomic<uint64_t> g_fork_generation{0};

namespace {

void BumpForkGeneration() {
  // relaxed: the child has one thread here; see process_owner.h.
  g_fork_generation.fetch_add(1, std::memory_order_relaxed);
}

// Registered while the library loads, before any handle can be opened.
const int g_atfork_registered = pthread_atfork(nullptr, nullptr, BumpForkGeneration);

}  // namespace

ProcessOwner::ProcessOwner() noexcept
    // relaxed: see process_owner.h.
    : generation_(g_fork_generation.load(std::memory_order_relaxed)), pid_(::getpid()) {
  (void)g_atfork_registered;
}

std::string ProcessOwner::ForkedMessage(const std::string& what, const char* kind) const {
  return what + " was opened by process " + std::to_string(pid_) + "; this is process " +
         std::to_string(::getpid()) + " (a forked child must open its own " + kind + ")";
}

void ProcessOwner::CheckNotForked(const std::string& what, const char* kind) const {
  if (forked()) throw Error(ErrorKind::kInvalidArgument, ForkedMessage(what, kind));
}

}  // namespace tailcut::detail
