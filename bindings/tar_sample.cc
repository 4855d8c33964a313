// tailcut._core.tar_members: a record of the "tar" format (one WebDataset
// sample: the run of tar members that share a key, headers included) as
// WebDataset hands a sample out: {"__key__": key, suffix: bytes, ...}, e.g.
// {"__key__": "train/000123", "jpg": b"...", "json": b"..."}.
//
// Control path: it allocates and copies each member's data into bytes (a
// record view is valid only until the next record; a sample dict outlives
// it); bytes that are not one sample raise CorruptError naming the offset,
// as tailcut::TarSample does.
#include "tar_sample.h"

#include <pybind11/pybind11.h>

#include <string>

#include "conversions.h"
#include "errors.h"
#include "tailcut/tar_sample.h"

namespace tailcut::python {

void DefineTarSample(py::module_& m) {
  m.def(
      "tar_members",
      [](const py::object& record) {
        const std::string bytes = ToBytes(record, "tar_members: record");
        tc::Record r;
        r.data = reinterpret_cast<const std::byte*>(bytes.data());
        r.size = bytes.size();
        r.end = bytes.size();
        tc::TarSample sample(r);
        py::dict out;
        out["__key__"] = py::str(sample.key());
        for (const tc::TarMember& member : sample.members()) {
          const std::string suffix(member.suffix());
          // WebDataset keeps the first of two members with one suffix.
          if (out.contains(suffix)) continue;
          out[py::str(suffix)] = py::bytes(reinterpret_cast<const char*>(member.data), member.size);
        }
        return out;
      },
      py::arg("record"),
      "The members of one WebDataset sample, a record of format='tar' (the run of tar members "
      "that share a key, headers included), as WebDataset gives a sample: a dict of "
      "'__key__' (the members' shared name up to its first '.') and, per member, its suffix "
      "('jpg', 'json', 'seg.png') mapped to its bytes. Raises CorruptError naming the offset "
      "when the bytes are not one sample.");
}

}  // namespace tailcut::python
