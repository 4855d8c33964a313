#!/usr/bin/python3
"""Runs work_queue_bench and prints median ns/op and ratios per process count.

    bench/engine_ratios.py [--binary PATH] [--repetitions N] [--no-interleave]
                           [--json-in FILE] [--json-out FILE] [-- extra benchmark flags]

Runs the binary once with --benchmark_format=json, N repetitions (default 5)
in random interleaved order (or reads a saved JSON with --json-in), takes the
median of each benchmark's ns_per_op over the repetitions, and prints one row
per process count:

    tailcut/floor           take+ack over one shared fetch_add   (target <= 3 at 1 process)
    mq_recv/tailcut         message_queue receive over take+ack  (target >= 20)
    mq_recv_ack/tailcut     message_queue receive+ack-send over take+ack
    tailcut_1k/floor        the same take+ack on a 1K-item queue (diagnostic: no
                            cache miss on the item table)

Standard library only.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

FAMILIES = {
    "floor": "BM_Floor_FetchAdd",
    "tailcut": "BM_Tailcut_TakeAck",
    "tailcut_1k": "BM_Tailcut_TakeAck_1KItems",
    "mq_recv": "BM_MessageQueue_Receive",
    "mq_recv_ack": "BM_MessageQueue_ReceiveAck",
}
FLOOR_TARGET = 3.0      # tailcut within 3x of the floor at 1 process
MQ_TARGET = 20.0        # tailcut at least 20x faster than message_queue


def default_binary():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for build in ("build-bench", "build"):
        path = os.path.join(root, build, "bin", "work_queue_bench")
        if os.path.exists(path):
            return path
    return os.path.join(root, "build", "bin", "work_queue_bench")


def run_benchmark(binary, repetitions, interleave, extra):
    command = [binary, "--benchmark_format=json",
               f"--benchmark_repetitions={repetitions}"]
    if interleave:
        # Repetitions of all benchmarks in random order: a burst of load from
        # elsewhere hits every family alike instead of one of them.
        command.append("--benchmark_enable_random_interleaving=true")
    command += extra
    print("running: " + " ".join(command), file=sys.stderr, flush=True)
    result = subprocess.run(command, stdout=subprocess.PIPE, check=False)
    if result.returncode != 0:
        sys.exit(f"engine_ratios: {binary} exited with {result.returncode}")
    return json.loads(result.stdout)


def collect(data):
    """{(family, procs): [ns_per_op of each repetition]} and the errors."""
    runs, errors = {}, []
    for entry in data.get("benchmarks", []):
        if entry.get("run_type", "iteration") != "iteration":
            continue  # aggregates: the median is recomputed below
        name = entry.get("run_name", entry["name"])
        if entry.get("error_occurred"):
            errors.append(f"{name}: {entry.get('error_message', 'error')}")
            continue
        family = name.split("/")[0]
        if "ns_per_op" not in entry or "procs" not in entry:
            continue
        runs.setdefault((family, int(entry["procs"])), []).append(float(entry["ns_per_op"]))
    return runs, errors


def fmt(value, digits=1):
    return "-" if value is None else f"{value:.{digits}f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", default=default_binary())
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--no-interleave", action="store_true",
                        help="run each benchmark's repetitions back to back")
    parser.add_argument("--json-in", help="read saved benchmark JSON instead of running")
    parser.add_argument("--json-out", help="save the benchmark JSON here")
    parser.add_argument("extra", nargs="*", help="flags passed on to the binary (after --)")
    args = parser.parse_args()

    if args.json_in:
        with open(args.json_in) as f:
            data = json.load(f)
    else:
        data = run_benchmark(args.binary, args.repetitions, not args.no_interleave, args.extra)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(data, f, indent=1)

    runs, errors = collect(data)
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    medians = {key: statistics.median(values) for key, values in runs.items()}
    spread = {key: (min(values), max(values), len(values)) for key, values in runs.items()}

    context = data.get("context", {})
    cpus = context.get("num_cpus") or os.cpu_count()
    load = context.get("load_avg")
    print(f"host: {context.get('host_name', '?')}, {cpus} CPUs at "
          f"{context.get('mhz_per_cpu', '?')} MHz, load average at start "
          f"{', '.join(f'{x:.2f}' for x in load) if load else '?'}")
    reps = sorted({n for (_, _, n) in spread.values()})
    print(f"median ns per operation over {'/'.join(map(str, reps)) or 0} repetitions "
          f"(wall time of a round / operations in it)\n")

    header = ["procs", "floor", "tailcut", "tailcut_1k", "mq_recv", "mq_recv_ack",
              "tailcut/floor", "mq_recv/tailcut", "mq_recv_ack/tailcut", "tailcut_1k/floor"]
    rows = []
    all_procs = sorted({procs for (_, procs) in medians})
    verdicts = []
    for procs in all_procs:
        value = {key: medians.get((family, procs)) for key, family in FAMILIES.items()}
        tailcut = value["tailcut"]

        def ratio(a, b):
            return a / b if a is not None and b else None

        over_floor = ratio(tailcut, value["floor"])
        mq_ratio = ratio(value["mq_recv"], tailcut)
        mq_ack_ratio = ratio(value["mq_recv_ack"], tailcut)
        small_over_floor = ratio(value["tailcut_1k"], value["floor"])
        label = str(procs) + ("*" if cpus and procs > cpus else "")
        rows.append([label, fmt(value["floor"]), fmt(tailcut), fmt(value["tailcut_1k"]),
                     fmt(value["mq_recv"]), fmt(value["mq_recv_ack"]), fmt(over_floor, 2),
                     fmt(mq_ratio, 2), fmt(mq_ack_ratio, 2), fmt(small_over_floor, 2)])
        if procs == 1 and over_floor is not None:
            verdicts.append(f"1 process: tailcut/floor = {over_floor:.2f} "
                            f"(target <= {FLOOR_TARGET:g}): "
                            f"{'met' if over_floor <= FLOOR_TARGET else 'NOT met'}")
        for name, r in (("mq_recv", mq_ratio), ("mq_recv_ack", mq_ack_ratio)):
            if r is not None:
                verdicts.append(f"{procs} process{'es' if procs > 1 else ''}: {name}/tailcut = "
                                f"{r:.2f} (target >= {MQ_TARGET:g}): "
                                f"{'met' if r >= MQ_TARGET else 'NOT met'}")

    widths = [max(len(header[i]), *(len(row[i]) for row in rows)) for i in range(len(header))]
    print("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))
    if any(cpus and procs > cpus for procs in all_procs):
        print(f"\n* more processes than the {cpus} CPUs: oversubscribed, the processes "
              "take turns on the cores")
    print("\nspread (min..max ns/op over repetitions):")
    for (family, procs), (low, high, n) in sorted(spread.items()):
        print(f"  {family}/procs:{procs}: {low:.1f}..{high:.1f} (n={n})")
    if verdicts:
        print("\ntargets:")
        for verdict in verdicts:
            print("  " + verdict)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
