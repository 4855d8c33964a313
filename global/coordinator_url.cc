// Parsing redis://[user[:password]@]HOST:PORT/DB and the environment.
#include <charconv>
#include <cstdlib>
#include <string>

#include "tailcut/error.h"
#include "tailcut/global_tier.h"

namespace tailcut {
namespace {

// `shown` goes through Printable: a NUL would end the message (and the C
// strings hiredis gets) early, a newline would forge a line of a log.
[[noreturn]] void BadUrl(std::string_view shown, const std::string& what) {
  throw Error(ErrorKind::kInvalidArgument, "coordinator URL '" + Printable(shown) + "': " + what +
                                               "; expected redis://[user[:password]@]HOST:PORT/DB");
}

bool ParseInt(std::string_view text, int* value) {
  if (text.empty()) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *value);
  return ec == std::errc() && end == text.data() + text.size();
}

}  // namespace

std::string CoordinatorAddress::Display() const {
  std::string url = "redis://";
  if (!user.empty()) url += user + "@";
  url += host + ":" + std::to_string(port) + "/" + std::to_string(db);
  return url;
}

CoordinatorAddress ParseCoordinatorUrl(std::string_view url) {
  constexpr std::string_view kScheme = "redis://";
  // What errors show: the URL with anything before '@' cut, so a password
  // never reaches a message.
  std::string shown(url);
  if (size_t at = shown.rfind('@'); at != std::string::npos) {
    shown = std::string(kScheme) + "***@" + shown.substr(at + 1);
  }
  for (char c : url) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      BadUrl(shown, "it contains the control character '" + Printable(std::string_view(&c, 1)) +
                        "'; remove it");
    }
  }
  if (url.substr(0, kScheme.size()) != kScheme) BadUrl(shown, "it must start with redis://");
  std::string_view rest = url.substr(kScheme.size());
  CoordinatorAddress address;
  if (size_t at = rest.rfind('@'); at != std::string_view::npos) {
    std::string_view userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
    size_t colon = userinfo.find(':');
    address.user = std::string(userinfo.substr(0, colon));
    if (colon != std::string_view::npos) address.password = std::string(userinfo.substr(colon + 1));
    if (colon != std::string_view::npos && address.password.empty()) {
      BadUrl(shown, "the password after ':' is empty");
    }
  }
  size_t slash = rest.find('/');
  std::string_view hostport = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    if (!ParseInt(rest.substr(slash + 1), &address.db) || address.db < 0) {
      BadUrl(shown, "the database after '/' is not a number >= 0");
    }
  }
  size_t colon = hostport.rfind(':');
  address.host = std::string(hostport.substr(0, colon));
  if (address.host.empty()) BadUrl(shown, "the host is missing");
  if (colon != std::string_view::npos) {
    if (!ParseInt(hostport.substr(colon + 1), &address.port) || address.port <= 0 ||
        address.port > 65535) {
      BadUrl(shown, "the port is not a number in 1..65535");
    }
  }
  return address;
}

CoordinatorAddress CoordinatorFromEnvironment(std::string_view url) {
  std::string chosen(url);
  if (chosen.empty()) {
    const char* env = std::getenv("TAILCUT_COORDINATOR");
    if (env == nullptr || *env == '\0') {
      throw Error(ErrorKind::kInvalidArgument,
                  "no coordinator: set TAILCUT_COORDINATOR to "
                  "redis://HOST:PORT/DB or pass the URL");
    }
    chosen = env;
  }
  CoordinatorAddress address = ParseCoordinatorUrl(chosen);
  if (address.password.empty()) {
    if (const char* password = std::getenv("TAILCUT_REDIS_PASSWORD")) address.password = password;
  }
  return address;
}

}  // namespace tailcut
