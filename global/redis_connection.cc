#include "global/redis_connection.h"

#include <sys/time.h>

#include <algorithm>
#include <thread>
#include <utility>

namespace tailcut::detail {
namespace {

timeval ToTimeval(std::chrono::milliseconds ms) {
  return timeval{static_cast<time_t>(ms.count() / 1000),
                 static_cast<suseconds_t>(ms.count() % 1000 * 1000)};
}

bool StartsWith(const redisReply* reply, std::string_view prefix) {
  return reply->type == REDIS_REPLY_ERROR &&
         std::string_view(reply->str, reply->len).substr(0, prefix.size()) == prefix;
}

Reply RunOnce(redisContext* context, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lengths;
  for (const std::string& arg : args) {
    argv.push_back(arg.data());
    lengths.push_back(arg.size());
  }
  return Reply(static_cast<redisReply*>(
      redisCommandArgv(context, static_cast<int>(argv.size()), argv.data(), lengths.data())));
}

}  // namespace

RedisConnection::RedisConnection(CoordinatorAddress address,
                                 std::chrono::milliseconds command_timeout,
                                 std::chrono::milliseconds retry_for,
                                 std::function<void(const std::string&)> on_notice)
    : address_(std::move(address)),
      command_timeout_(command_timeout),
      retry_for_(retry_for),
      on_notice_(std::move(on_notice)) {}

RedisConnection::~RedisConnection() { Disconnect(); }

void RedisConnection::Disconnect() noexcept {
  if (context_ != nullptr) redisFree(context_);
  context_ = nullptr;
}

// Returns false with *error set on a transient failure (refused, timeout,
// loading); throws on a wrong password, which no retry fixes.
bool RedisConnection::TryConnect(std::string* error) {
  context_ =
      redisConnectWithTimeout(address_.host.c_str(), address_.port, ToTimeval(command_timeout_));
  if (context_ == nullptr || context_->err) {
    *error = context_ ? context_->errstr : "out of memory";
    Disconnect();
    return false;
  }
  redisSetTimeout(context_, ToTimeval(command_timeout_));
  std::vector<std::vector<std::string>> setup;
  if (!address_.password.empty()) {
    if (address_.user.empty()) {
      setup.push_back({"AUTH", address_.password});
    } else {
      setup.push_back({"AUTH", address_.user, address_.password});
    }
  }
  if (address_.db != 0) setup.push_back({"SELECT", std::to_string(address_.db)});
  setup.push_back({"PING"});
  for (const auto& command : setup) {
    Reply reply = RunOnce(context_, command);
    if (!reply) {
      *error = context_->errstr;
      Disconnect();
      return false;
    }
    if (StartsWith(reply.get(), "LOADING")) {
      *error = "Redis is loading its data";
      Disconnect();
      return false;
    }
    if (reply->type == REDIS_REPLY_ERROR) {
      // The reply never contains the password; the command might, so only
      // the command's name is shown.
      std::string what(reply->str, reply->len);
      Disconnect();
      const std::string user = address_.user.empty() ? "default" : address_.user;
      if (command[0] == "AUTH" || StartsWith(reply.get(), "NOAUTH")) {
        throw Error(ErrorKind::kPermission,
                    "Redis at " + address_.Display() + " refused user '" + user + "' (" + what +
                        "): set the right password in TAILCUT_REDIS_PASSWORD or the URL");
      }
      throw Error(ErrorKind::kIo, "Redis at " + address_.Display() + " answered " + command[0] +
                                      " with '" + what + "'");
    }
  }
  return true;
}

void RedisConnection::Connect() {
  if (context_ == nullptr) Run({"PING"});
}

Reply RedisConnection::Run(const std::vector<std::string>& args) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point give_up = Clock::now() + retry_for_;
  std::chrono::milliseconds backoff{50};
  std::string error;
  for (int attempt = 0;; ++attempt) {
    if (context_ != nullptr || TryConnect(&error)) {
      Reply reply = RunOnce(context_, args);
      if (reply && !StartsWith(reply.get(), "LOADING")) return reply;
      error = reply ? "Redis is loading its data" : context_->errstr;
      Disconnect();
    }
    if (Clock::now() + backoff > give_up) {
      throw Error(ErrorKind::kIo,
                  "cannot reach Redis at " + address_.Display() + " for " +
                      std::to_string(retry_for_.count()) + " ms (" + error +
                      "): start redis-server there or point TAILCUT_COORDINATOR at one that runs");
    }
    if (attempt == 0 && on_notice_) {
      on_notice_("Redis at " + address_.Display() + ": " + error + "; reconnecting for up to " +
                 std::to_string(retry_for_.count()) + " ms");
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds{1000});
  }
}

Reply RedisConnection::RunScript(const Script& script, const std::vector<std::string>& keys,
                                 const std::vector<std::string>& args) {
  std::string& sha = shas_[script.name];
  if (sha.empty()) {
    Reply loaded = Run({"SCRIPT", "LOAD", script.body});
    if (loaded->type != REDIS_REPLY_STRING) {
      throw Error(ErrorKind::kIo,
                  "Redis at " + address_.Display() + " could not load the " + script.name +
                      " script: " + std::string(loaded->str ? loaded->str : "", loaded->len));
    }
    sha.assign(loaded->str, loaded->len);
  }
  std::vector<std::string> command = {"EVALSHA", sha, std::to_string(keys.size())};
  command.insert(command.end(), keys.begin(), keys.end());
  command.insert(command.end(), args.begin(), args.end());
  Reply reply = Run(command);
  if (StartsWith(reply.get(), "NOSCRIPT")) {
    // A restarted or flushed server forgot the script; EVAL runs it and
    // caches it again under the same SHA1.
    command[0] = "EVAL";
    command[1] = script.body;
    reply = Run(command);
  }
  if (reply->type == REDIS_REPLY_ERROR) {
    throw Error(ErrorKind::kCorrupt, "the " + std::string(script.name) + " script failed on " +
                                         address_.Display() + ": " +
                                         std::string(reply->str, reply->len));
  }
  return reply;
}

}  // namespace tailcut::detail
