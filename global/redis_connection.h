// RedisConnection: one hiredis connection with AUTH, SELECT, a timeout on
// every command, bounded reconnects, and scripts run by EVALSHA with a
// fallback to EVAL. Internal to global/.
#ifndef TAILCUT_GLOBAL_REDIS_CONNECTION_H_
#define TAILCUT_GLOBAL_REDIS_CONNECTION_H_

#include <hiredis/hiredis.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tailcut/global_tier.h"

namespace tailcut::detail {

struct ReplyDeleter {
  void operator()(redisReply* reply) const noexcept { freeReplyObject(reply); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

struct Script {
  const char* name;  // for messages
  const char* body;  // Lua
};

// Not thread-safe: the caller serializes (GlobalTier holds a mutex).
class RedisConnection {
 public:
  RedisConnection(CoordinatorAddress address, std::chrono::milliseconds command_timeout,
                  std::chrono::milliseconds retry_for,
                  std::function<void(const std::string&)> on_notice);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Connects now, so a bad address or password fails Open. Throws like Run.
  void Connect();

  // Runs one command. A lost connection, a timeout, or a server still
  // loading its data is retried after reconnecting, with backoff, for at most
  // retry_for; then kIo naming the URL. Any other error reply is returned.
  Reply Run(const std::vector<std::string>& args);

  // EVALSHA of the script (EVAL when the server does not know it). An error
  // reply from the script throws kCorrupt naming the script.
  Reply RunScript(const Script& script, const std::vector<std::string>& keys,
                  const std::vector<std::string>& args);

  const CoordinatorAddress& address() const noexcept { return address_; }

 private:
  bool TryConnect(std::string* error);
  void Disconnect() noexcept;

  CoordinatorAddress address_;
  std::chrono::milliseconds command_timeout_;
  std::chrono::milliseconds retry_for_;
  std::function<void(const std::string&)> on_notice_;
  redisContext* context_ = nullptr;
  std::map<std::string, std::string> shas_;  // script name -> SHA1 from SCRIPT LOAD
};

}  // namespace tailcut::detail

#endif  // TAILCUT_GLOBAL_REDIS_CONNECTION_H_
