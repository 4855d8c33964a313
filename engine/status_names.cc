// The ...Name() functions of work_queue.h's status enums.
#include "tailcut/work_queue.h"

namespace tailcut {

const char* TakeStatusName(TakeStatus status) noexcept {
  switch (status) {
    case TakeStatus::kOk:
      return "ok";
    case TakeStatus::kEnd:
      return "end";
    case TakeStatus::kEmpty:
      return "empty";
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

const char* AckStatusName(AckStatus status) noexcept {
  switch (status) {
    case AckStatus::kOk:
      return "ok";
    case AckStatus::kStale:
      return "stale";
    case AckStatus::kInvalid:
      return "invalid";
    case AckStatus::kOutOfRange:
      return "out of range";
    case AckStatus::kAlreadyDone:
      return "already done";
    case AckStatus::kClosed:
      return "closed";
    case AckStatus::kForked:
      return "forked";
  }
  return "?";
}

}  // namespace tailcut
