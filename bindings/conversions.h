// Conversions of Python arguments to the C++ library's types, with the
// binding's error messages. REQUIRES: the GIL, for every function here.
//
// One message shape, the same as tailcut/_args.py's: "<what> must be <rule>,
// got <repr> (<type>)", e.g. "num_epochs must be an int >= 0, got '2' (str)";
// a wrong type raises TypeError, a value out of range InvalidArgumentError.
// A bool is not a count, a str is not a number, a float is not a count;
// anything with __index__ (numpy integers) is.
#pragma once

#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "tailcut/record_format.h"

namespace py = pybind11;
namespace tc = tailcut;

namespace tailcut::python {

// Raise TypeError / InvalidArgumentError "<what> must be <rule>, got ...".
[[noreturn]] void RaiseType(const char* what, const std::string& rule, const py::handle& value);
[[noreturn]] void RaiseValue(const char* what, const std::string& rule, const py::handle& value);

// An int in [min_value, max_value].
uint64_t ToU64(const py::handle& value, const char* what, uint64_t min_value = 0,
               uint64_t max_value = UINT64_MAX);
// None, or ToU64's int.
std::optional<uint64_t> ToU64OrNone(const py::handle& value, const char* what,
                                    uint64_t min_value = 0, uint64_t max_value = UINT64_MAX);
// A count the engine keeps in 32 bits: larger values are refused, not cut.
uint32_t ToU32(const py::handle& value, const char* what, uint32_t min_value = 0);
// A finite number of seconds >= 0 (or None, as nullopt, where or_none).
double ToSeconds(const py::handle& value, const char* what);
std::optional<double> ToSecondsOrNone(const py::handle& value, const char* what);
// True or False (numpy's bools too); not 0, 1, None or a str.
bool ToFlag(const py::handle& value, const char* what);
// A str (UTF-8). NUL and other control characters are the library's to
// refuse, where the value enters it (with the message that names the value).
std::string ToText(const py::handle& value, const char* what);
std::chrono::milliseconds ToMillis(double seconds);
// A str, bytes or os.PathLike path, as the bytes of the file name
// (os.fsencode): names that are not UTF-8 work too.
std::string ToPath(const py::handle& value);
// A queue name: a str of ASCII characters other than NUL (the library then
// checks the characters it allows). Anything else raises
// InvalidArgumentError naming the name in full, since C strings (and so the
// library's messages) end at a NUL.
std::string ToQueueName(const py::handle& value);
// The str that os.fsencode turns back into these bytes (os.fsdecode: bytes
// that are not UTF-8 become lone surrogates), usable with open() and os.*.
py::str FromPath(const std::string& path);
// bytes or any buffer.
std::string ToBytes(const py::handle& value, const char* what);
// on_notice: a Python callable, called with the GIL from whatever thread the
// C++ notice comes from, with the notice in Python's words (PythonWording).
// The callable is released with the GIL held. None: an empty function.
std::function<void(const std::string&)> WrapNotice(const py::object& fn);
tc::RecordFormat ParseFormat(const std::string& name, const py::object& record_bytes);

}  // namespace tailcut::python
