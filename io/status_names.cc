// The ...Name() functions of io/'s status enums (reader.h, record_format.h).
#include "tailcut/reader.h"
#include "tailcut/record_format.h"

namespace tailcut {

const char* ReadStatusName(ReadStatus status) noexcept {
  switch (status) {
    case ReadStatus::kOk:
      return "ok";
    case ReadStatus::kEnd:
      return "end";
    case ReadStatus::kError:
      return "error";
    case ReadStatus::kEmpty:
      return "empty";
    case ReadStatus::kHoldsFinished:
      return "holds finished";
    case ReadStatus::kForked:
      return "forked";
  }
  return "?";
}

const char* ParseStatusName(ParseStatus status) noexcept {
  switch (status) {
    case ParseStatus::kRecord:
      return "record";
    case ParseStatus::kNeedMore:
      return "need more";
    case ParseStatus::kDone:
      return "done";
    case ParseStatus::kError:
      return "error";
  }
  return "?";
}

}  // namespace tailcut
