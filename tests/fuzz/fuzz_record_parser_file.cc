// libFuzzer target: the file record parser (see fuzz_record_parser.h).
#include "fuzz_record_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return tailcut::fuzz::FuzzRecordParser(tailcut::RecordFormatKind::kFile, data, size);
}
