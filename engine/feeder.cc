#include "engine/feeder.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "engine/config.h"

namespace tailcut::detail {

namespace {

// The directory libtailcut was loaded from: libtailcut_global sits beside it
// (the build tree, the install's lib directory, the Python package).
std::string OwnDirectory() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&OpenFeeder), &info) == 0 || info.dli_fname == nullptr)
    return "";
  std::string path = info.dli_fname;
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

}  // namespace

std::string ResolveCoordinator(const WorkQueueOptions& options) {
  if (!options.coordinator.empty()) return options.coordinator;
  const char* env = std::getenv("TAILCUT_COORDINATOR");
  return env == nullptr ? "" : env;
}

std::string ResolveHostId(const WorkQueueOptions& options) {
  std::string id = options.host_id;
  if (id.empty()) {
    const char* env = std::getenv("TAILCUT_HOST_ID");
    if (env != nullptr) id = env;
  }
  if (id.empty()) {
    char name[256] = {};
    if (::gethostname(name, sizeof(name) - 1) == 0) id = name;
  }
  const std::string where = options.host_id.empty() ? "TAILCUT_HOST_ID or the hostname" : "host_id";
  if (id.empty() || id.size() > 64)
    throw Error(ErrorKind::kInvalidArgument,
                "queue '" + options.name + "': the host id from " + where +
                    " must be 1 to 64 characters; set host_id (TAILCUT_HOST_ID)");
  // The id becomes part of shared-memory names ('<queue>.<host id>'), Redis
  // keys and command lines: '.' and '..' would name a directory, a leading
  // '-' reads as an option.
  if (id.find_first_not_of('.') == std::string::npos || id[0] == '-')
    throw Error(ErrorKind::kInvalidArgument,
                "queue '" + options.name + "': the host id '" + Printable(id) + "' from " + where +
                    " may not be only dots or start with '-'; set host_id (TAILCUT_HOST_ID) to "
                    "a name such as 'node-0'");
  for (char c : id)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
          c == '_' || c == '.'))
      throw Error(ErrorKind::kInvalidArgument,
                  "queue '" + options.name + "': the host id '" + Printable(id) + "' from " +
                      where +
                      " may only hold letters, digits, '.', '_' and '-'; set host_id "
                      "(TAILCUT_HOST_ID)");
  return id;
}

std::unique_ptr<Feeder> OpenFeeder(const WorkQueueOptions& options, const FeedJob& job) {
  if (ResolveCoordinator(options).empty()) return nullptr;
  const std::string lib = "libtailcut_global.so.0";
  std::string dir = OwnDirectory();
  void* handle = dir.empty() ? nullptr : ::dlopen((dir + lib).c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) handle = ::dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    throw Error(ErrorKind::kNotFound,
                "queue '" + options.name + "': a coordinator is set (" +
                    (options.coordinator.empty() ? "TAILCUT_COORDINATOR" : "coordinator") +
                    ") but " + lib + " cannot be loaded (" + (why ? why : "not found") +
                    "): build tailcut with hiredis (apt-get install libhiredis-dev) and keep the "
                    "library beside libtailcut, or unset the coordinator to run on one host");
  }
  // The handle stays open for the life of the process: the feeder's code and
  // its thread may outlive any one queue.
  auto factory = reinterpret_cast<FeederFactory>(::dlsym(handle, kFeederFactorySymbol));
  if (factory == nullptr)
    throw Error(ErrorKind::kNotFound, "queue '" + options.name + "': " + dir + lib + " has no " +
                                          kFeederFactorySymbol +
                                          ": it is from another tailcut build; reinstall both");
  return std::unique_ptr<Feeder>(factory(options, job));
}

}  // namespace tailcut::detail
