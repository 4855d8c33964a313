#include "stats.h"

namespace tailcut::python {

namespace {

py::dict ClientDict(const tc::ClientStats& c) {
  py::dict d;
  d["slot"] = c.slot;
  d["pid"] = c.pid;
  d["alive"] = c.alive;
  d["items_taken"] = c.items_taken;
  d["items_acked"] = c.items_acked;
  d["items_given_back"] = c.items_given_back;
  d["items_recovered"] = c.items_recovered;
  d["bytes_acked"] = c.bytes_acked;
  d["records"] = c.records;
  d["stale_acks"] = c.stale_acks;
  d["splits"] = c.splits;
  d["open_items"] = c.open_items;
  d["busy_ns"] = c.busy_ns;
  d["idle_ns"] = c.idle_ns;
  d["last_progress_ns"] = c.last_progress_ns;
  d["joined_ns"] = c.joined_ns;
  return d;
}

}  // namespace

py::dict StatsDict(const tc::QueueStats& s) {
  py::dict d;
  d["name"] = s.name;
  d["segment_path"] = s.segment_path;
  d["num_items"] = s.num_items;
  d["num_epochs"] = s.num_epochs;
  d["total"] = s.total;
  d["done"] = s.done;
  d["in_flight"] = s.in_flight;
  d["handed_out"] = s.handed_out;
  d["epoch"] = s.epoch;
  d["seed"] = s.seed;
  d["shuffle"] = s.shuffle;
  d["num_clients"] = s.num_clients;
  d["clients_joined"] = s.clients_joined;
  d["recovered_items"] = s.recovered_items;
  d["stale_acks"] = s.stale_acks;
  d["splits"] = s.splits;
  d["now_ns"] = s.now_ns;
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

void AddSummary(QueueHandle& h, const py::object& writer, const py::object& step,
                const std::string& prefix) {
  tc::QueueStats s = StatsOf(h);
  py::object add = writer.attr("add_scalar");
  auto put = [&](const std::string& tag, double value) { add(prefix + "/" + tag, value, step); };
  put("done", static_cast<double>(s.done));
  put("total", static_cast<double>(s.total));
  put("progress", s.total ? static_cast<double>(s.done) / static_cast<double>(s.total) : 0.0);
  put("in_flight", static_cast<double>(s.in_flight));
  put("handed_out", static_cast<double>(s.handed_out));
  put("epoch", static_cast<double>(s.epoch));
  put("clients_joined", static_cast<double>(s.clients_joined));
  uint64_t alive = 0;
  for (const auto& c : s.clients) alive += c.alive;
  put("clients_alive", static_cast<double>(alive));
  put("recovered_items", static_cast<double>(s.recovered_items));
  put("stale_acks", static_cast<double>(s.stale_acks));
  put("splits", static_cast<double>(s.splits));
  for (const auto& c : s.clients) {
    std::string p = "client_" + std::to_string(c.slot) + "/";
    put(p + "alive", c.alive ? 1.0 : 0.0);
    put(p + "items_taken", static_cast<double>(c.items_taken));
    put(p + "items_acked", static_cast<double>(c.items_acked));
    put(p + "items_given_back", static_cast<double>(c.items_given_back));
    put(p + "items_recovered", static_cast<double>(c.items_recovered));
    put(p + "bytes_acked", static_cast<double>(c.bytes_acked));
    put(p + "records", static_cast<double>(c.records));
    put(p + "stale_acks", static_cast<double>(c.stale_acks));
    put(p + "splits", static_cast<double>(c.splits));
    put(p + "open_items", static_cast<double>(c.open_items));
    put(p + "busy_seconds", static_cast<double>(c.busy_ns) * 1e-9);
    put(p + "idle_seconds", static_cast<double>(c.idle_ns) * 1e-9);
  }
}

}  // namespace tailcut::python
