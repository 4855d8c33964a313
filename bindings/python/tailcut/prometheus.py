"""A Prometheus exporter of this user's tailcut queues and batch rings on the host.

    python3 -m tailcut.prometheus --port 9464            # http://HOST:9464/metrics

One scrape covers every job of the user on the host: each queue (label `job`, its name) and each
batch ring of pooled loaders (label `ring`), with `host` on every sample and, per process, `pid`
and its `role` (a ring's `trainer`, that is a rank, or `loader`). Nothing runs between scrapes:
each one reads the shared memory as `tailcut top` does (tailcut.list_queues, inspect_queue,
inspect_batch_ring), joins nothing and slows no job. The numbers a user asks of an input
pipeline:

- tailcut_ring_client_wait_seconds_total{role="trainer"}: how long each rank waited for its
  batches (rate() of it is the share of time a rank is input-bound); role="loader": how long a
  loader waited for a free slot (the ranks are the bottleneck).
- tailcut_ring_client_batches_total: batches each loader published, each rank popped.
- tailcut_ring_slots{state}: free, filling and ready slots of the ring now.
- tailcut_queue_done / tailcut_queue_total, tailcut_queue_epoch: progress of the queue's work.
- tailcut_queue_client_acked_total, _records_total, _busy_seconds_total, _idle_seconds_total,
  _open_items: per process of a queue (loaders and ranks that take items).

Needs python3-prometheus-client (Debian's package); `import tailcut` does not import it.
"""

import argparse
import glob
import os
import socket
import sys
import time

import tailcut

_RING_GLOB = "/dev/shm/tailcut-ring.{euid}.*"


def host_id():
    """The host label: TAILCUT_HOST_ID, else the hostname (as a coordinated queue names it)."""
    return os.environ.get("TAILCUT_HOST_ID") or socket.gethostname()


def ring_names():
    """This user's batch rings on the host (their segments in /dev/shm)."""
    prefix = f"/dev/shm/tailcut-ring.{os.geteuid()}."
    return sorted(path[len(prefix):] for path in glob.glob(_RING_GLOB.format(euid=os.geteuid())))


class Collector:
    """A prometheus_client collector: every collect() reads the host's queues and rings anew."""

    def __init__(self, host=None):
        self.host = host or host_id()

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        host = self.host

        def gauge(name, doc, labels):
            return GaugeMetricFamily(name, doc, labels=["host", *labels])

        def counter(name, doc, labels):
            return CounterMetricFamily(name, doc, labels=["host", *labels])

        q_epoch = gauge("tailcut_queue_epoch", "the epoch the queue hands out now", ["job"])
        q_epochs = gauge("tailcut_queue_epochs", "epochs of the queue", ["job"])
        q_done = gauge("tailcut_queue_done", "items done, over all epochs", ["job"])
        q_total = gauge("tailcut_queue_total", "items of all epochs", ["job"])
        q_flight = gauge("tailcut_queue_in_flight", "items held by processes now", ["job"])
        q_clients = gauge("tailcut_queue_live_clients", "live processes of the queue", ["job"])
        q_recovered = counter("tailcut_queue_recovered_items",
                              "items handed out again (a process died, stopped or gave back)",
                              ["job"])
        q_stale = counter("tailcut_queue_stale_acks", "acks refused after a reassignment", ["job"])
        c_acked = counter("tailcut_queue_client_acked", "items a process acked", ["job", "pid"])
        c_records = counter("tailcut_queue_client_records", "records a process reported",
                            ["job", "pid"])
        c_busy = counter("tailcut_queue_client_busy_seconds",
                         "time a process was registered and not waiting in take", ["job", "pid"])
        c_idle = counter("tailcut_queue_client_idle_seconds",
                         "time a process waited in take for an item", ["job", "pid"])
        c_open = gauge("tailcut_queue_client_open_items", "items a process holds now",
                       ["job", "pid"])
        r_slots = gauge("tailcut_ring_slots", "slots of the ring by state", ["ring", "state"])
        r_published = counter("tailcut_ring_batches_published", "batches published into the ring",
                              ["ring"])
        r_popped = counter("tailcut_ring_batches_popped", "batches ranks popped", ["ring"])
        rc_wait = counter("tailcut_ring_client_wait_seconds",
                          "time a rank waited for a batch (role trainer), or a loader for a free "
                          "slot (role loader)", ["ring", "role", "pid"])
        rc_waiting = gauge("tailcut_ring_client_waiting_seconds",
                           "how long the process has been waiting now (0: not waiting)",
                           ["ring", "role", "pid"])
        rc_batches = counter("tailcut_ring_client_batches",
                             "batches a loader published or a rank popped", ["ring", "role", "pid"])

        for listing in tailcut.list_queues():
            if not listing.get("valid", True):
                continue
            name = listing["name"]
            try:
                s = tailcut.inspect_queue(name)
            except tailcut.Error:
                continue  # removed (or being made) between the listing and now
            labels = [host, name]
            q_epoch.add_metric(labels, s["epoch"])
            q_epochs.add_metric(labels, s["num_epochs"])
            q_done.add_metric(labels, s["done"])
            q_total.add_metric(labels, s["total"])
            q_flight.add_metric(labels, s["in_flight"])
            q_clients.add_metric(labels, sum(c["alive"] for c in s["clients"]))
            q_recovered.add_metric(labels, s["recovered_items"])
            q_stale.add_metric(labels, s["stale_acks"])
            for c in s["clients"]:
                if not c["alive"]:
                    continue
                cl = [host, name, str(c["pid"])]
                c_acked.add_metric(cl, c["items_acked"])
                c_records.add_metric(cl, c["records"])
                c_busy.add_metric(cl, c["busy_ns"] / 1e9)
                c_idle.add_metric(cl, c["idle_ns"] / 1e9)
                c_open.add_metric(cl, c["open_items"])

        for ring in ring_names():
            try:
                r = tailcut.inspect_batch_ring(ring)
            except tailcut.Error:
                continue
            for state in ("free", "filling", "ready"):
                r_slots.add_metric([host, ring, state], r[state])
            r_published.add_metric([host, ring], r["published"])
            r_popped.add_metric([host, ring], r["popped"])
            for c in r["clients"]:
                if not c["alive"]:
                    continue
                cl = [host, ring, c["role"], str(c["pid"])]
                rc_wait.add_metric(cl, c["wait_seconds"])
                rc_waiting.add_metric(cl, c["waiting_seconds"])
                rc_batches.add_metric(cl, c["published"] if c["role"] == "loader" else c["popped"])

        yield from (q_epoch, q_epochs, q_done, q_total, q_flight, q_clients, q_recovered, q_stale,
                    c_acked, c_records, c_busy, c_idle, c_open, r_slots, r_published, r_popped,
                    rc_wait, rc_waiting, rc_batches)


def serve(port, address="", host=None):
    """Starts the exporter's HTTP server (a daemon thread) on address:port; returns the
    registry it serves."""
    try:
        import prometheus_client
    except ImportError:
        raise tailcut.NotFoundError(
            "tailcut.prometheus needs prometheus_client: apt-get install python3-prometheus-client"
        ) from None
    registry = prometheus_client.CollectorRegistry()
    registry.register(Collector(host))
    prometheus_client.start_http_server(port, addr=address, registry=registry)
    return registry


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python3 -m tailcut.prometheus",
        description="Serve this user's tailcut queues and batch rings on this host to Prometheus "
                    "(GET /metrics). Each scrape reads the shared memory anew; nothing is kept.")
    parser.add_argument("--port", type=int, default=9464, help="TCP port (default 9464)")
    parser.add_argument("--address", default="",
                        help="address to listen on (default: all; 127.0.0.1 for this host only)")
    parser.add_argument("--host", default=None,
                        help="the host label (default: TAILCUT_HOST_ID, else the hostname)")
    args = parser.parse_args(argv)
    try:
        serve(args.port, args.address, args.host)
    except tailcut.Error as e:
        print(f"tailcut.prometheus: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"tailcut.prometheus: cannot listen on {args.address or '*'}:{args.port}: "
              f"{e.strerror}; pick another --port", file=sys.stderr)
        return 1
    print(f"tailcut.prometheus: serving http://{args.address or socket.gethostname()}:"
          f"{args.port}/metrics", file=sys.stderr, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
