// The ...Name() functions of work_queue.h's status enums.
#include "tailcut/work_queue.h"

namespace tailcut {

const char* TakeStatusName(TakeStatus status) noexcept {
  switch (status) {
    case TakeStatus::kOk:
      return "ok";
    case TakeStatus::kEnd:
      return "end";
    case TakeStatus::kTimeout:
      return "timeout";
    case TakeStatus::kLimit:
      return "lease limit";
    case TakeStatus::kClosed:
      return "closed";
    case TakeStatus::kForked:
      return "forked";
    case TakeStatus::kInvalidArgument:
      return "invalid argument";
    case TakeStatus::kJobLost:
      return "job lost";
  }
  return "?";
}

const char* StepStatusName(StepStatus status) noexcept {
  switch (status) {
    case StepStatus::kAllHaveBatch:
      return "all have batch";
    case StepStatus::kEndEpoch:
      return "end epoch";
    case StepStatus::kTimeout:
      return "timeout";
    case StepStatus::kInvalid:
      return "invalid";
    case StepStatus::kClosed:
      return "closed";
    case StepStatus::kForked:
      return "forked";
  }
  return "?";
}

const char* ItemStatusName(ItemStatus status) noexcept {
  switch (status) {
    case ItemStatus::kOk:
      return "ok";
    case ItemStatus::kStale:
      return "stale";
    case ItemStatus::kInvalid:
      return "invalid";
    case ItemStatus::kOutOfRange:
      return "out of range";
    case ItemStatus::kAlreadyDone:
      return "already done";
    case ItemStatus::kClosed:
      return "closed";
    case ItemStatus::kForked:
      return "forked";
  }
  return "?";
}

}  // namespace tailcut
