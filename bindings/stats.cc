#include "stats.h"

#include <type_traits>

#include "tailcut/stats_fields.h"

namespace tailcut::python {

namespace {

py::dict ClientDict(const tc::ClientStats& c) {
  py::dict d;
#define TAILCUT_PUT(type, name, series, doc) d[#name] = c.name;
  TAILCUT_CLIENT_STATS_FIELDS(TAILCUT_PUT)
#undef TAILCUT_PUT
  return d;
}

// One scalar of add_summary() for a field shown as `series`.
template <tc::StatsSeries series, typename T, typename Put>
void PutSeries(const Put& put, const std::string& tag, const T& value) {
  if constexpr (series == tc::StatsSeries::kValue) {
    put(tag, static_cast<double>(value));
  } else if constexpr (series == tc::StatsSeries::kSeconds) {
    static_assert(std::is_integral_v<T>, "a duration in ns");
    put(tag.substr(0, tag.size() - 3) + "_seconds", static_cast<double>(value) * 1e-9);
  }
}

}  // namespace

py::dict StatsDict(const tc::QueueStats& s) {
  py::dict d;
#define TAILCUT_PUT(type, name, series, doc) d[#name] = s.name;
  TAILCUT_QUEUE_STATS_FIELDS(TAILCUT_PUT)
#undef TAILCUT_PUT
  py::list clients;
  for (const auto& c : s.clients) clients.append(ClientDict(c));
  d["clients"] = clients;
  return d;
}

tc::QueueStats StatsOf(QueueHandle& h) {
  Use use(h);
  return h.queue->Stats();
}

py::dict ReaderStatsDict(const tc::ReaderStats& s) {
  py::dict d;
  d["bytes_read"] = s.bytes_read;
  d["records"] = s.records;
  d["items_taken"] = s.items_taken;
  d["items_acked"] = s.items_acked;
  d["items_given_back"] = s.items_given_back;
  d["reads"] = s.reads;
  d["short_reads"] = s.short_reads;
  d["retries"] = s.retries;
  d["carried_bytes"] = s.carried_bytes;
  d["stale_items"] = s.stale_items;
  return d;
}

const char* SeriesName(tc::StatsSeries series) {
  switch (series) {
    case tc::StatsSeries::kValue:
      return "value";
    case tc::StatsSeries::kSeconds:
      return "seconds";
    case tc::StatsSeries::kNone:
      break;
  }
  return "none";
}

py::dict StatsFields() {
  py::list queue, client;
#define TAILCUT_FIELD(type, name, series, doc) \
  list.append(py::make_tuple(#name, SeriesName(tc::StatsSeries::series), doc));
  {
    py::list& list = queue;
    TAILCUT_QUEUE_STATS_FIELDS(TAILCUT_FIELD)
  }
  {
    py::list& list = client;
    TAILCUT_CLIENT_STATS_FIELDS(TAILCUT_FIELD)
  }
#undef TAILCUT_FIELD
  py::dict d;
  d["queue"] = py::tuple(queue);
  d["client"] = py::tuple(client);
  return d;
}

void AddSummary(QueueHandle& h, const py::object& writer, const py::object& step,
                const std::string& prefix) {
  tc::QueueStats s = StatsOf(h);
  py::object add = writer.attr("add_scalar");
  auto put = [&](const std::string& tag, double value) { add(prefix + "/" + tag, value, step); };
#define TAILCUT_PUT(type, name, series, doc) PutSeries<tc::StatsSeries::series>(put, #name, s.name);
  TAILCUT_QUEUE_STATS_FIELDS(TAILCUT_PUT)
#undef TAILCUT_PUT
  put("progress", s.total ? static_cast<double>(s.done) / static_cast<double>(s.total) : 0.0);
  uint64_t alive = 0;
  for (const auto& c : s.clients) alive += c.alive;
  put("clients_alive", static_cast<double>(alive));
  for (const auto& c : s.clients) {
    std::string p = "client_" + std::to_string(c.slot) + "/";
#define TAILCUT_PUT(type, name, series, doc) \
  PutSeries<tc::StatsSeries::series>(put, p + #name, c.name);
    TAILCUT_CLIENT_STATS_FIELDS(TAILCUT_PUT)
#undef TAILCUT_PUT
  }
}

}  // namespace tailcut::python
