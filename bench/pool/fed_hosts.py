"""Two hosts of a synchronous job: a PooledLoader per host over a static split of the files
against a PooledLoader per host whose queue the coordinator feeds.

    PYTHONPATH=build/python python3 bench/pool/fed_hosts.py --out /tmp/fed_hosts

Every run is 2 nodes x 2 ranks on this machine: two `torchrun --nnodes 2 --node_rank 0|1`
c10d launches, as on two hosts. The job reads 8 files of 8-byte records (each its id),
--records in all; each node has one PooledLoader of --loaders processes; every loader batch
costs a sleep of --record-us per record (decoding and augmentation: a sleep, so the loaders
do not compete with the trainers for the shared cores), and every step sleeps --step-ms and
runs an all_reduce, as DDP's gradient all_reduce.

Modes:
  static  node n reads files[n::2] through its own queue (JOB.n<n>): the split of
          docs/pooled.md, "Several hosts".
  fed     both nodes open the queue JOB over all the files; a redis-server started here feeds
          each node's queue (TAILCUT_HOST_ID=n0|n1) blocks of --block tickets.
Cases:
  slow_loaders  node n1's loaders take twice as long per record.
  slow_files    the odd files take twice as long per record (in static, all on n1).
  balanced      the same cost everywhere: what the coordinator costs.

Each repeat runs every case in both modes, alternating which mode runs first; each run
trains --epochs epochs (epoch 0 includes starting the loaders and is left out). Per run:
rank 0's median epoch time over epochs 1.., and the records trained per second (records of
an epoch left over when the first rank ran out are reported, not trained). The table gives
per case and mode the median over repeats (range: min and max), and per repeat the ratio
static / fed of the epoch time and fed / static of records trained per second.
--out DIR writes results.json.
"""

import argparse
import json
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

FILES = 8
BATCH = 64


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- one rank (under torchrun) -----------------------------------------------------------------


def rank_main(args):
    import numpy as np
    import torch
    import torch.distributed as dist

    import tailcut.torch
    import tailcut.pool

    dist.init_process_group("gloo")
    rank, node = dist.get_rank(), int(os.environ["GROUP_RANK"])
    files = sorted(str(p) for p in pathlib.Path(args.data).glob("*.bin"))
    per_file = args.records // FILES
    node_factor = 2.0 if args.case == "slow_loaders" and node == 1 else 1.0

    def collate(records):
        # The loader's work: a sleep per record, twice as long where the case says so.
        ids = np.frombuffer(b"".join(records), dtype=np.int64)
        slow = int(np.sum((ids // per_file) % 2)) if args.case == "slow_files" else 0
        time.sleep((len(ids) + slow) * node_factor * args.record_us / 1e6)
        return ids.copy()

    if args.mode == "fed":
        opts = dict(name=args.job, global_block_size=args.block, on_notice=lambda line: None)
    else:
        files, opts = files[node::2], dict(name=f"{args.job}.n{node}")
    ds = tailcut.torch.QueueDataset(files, format="fixed", record_bytes=8,
                                    num_epochs=args.epochs, num_slices=args.slices,
                                    shuffle_buffer=0, interleave=1, **opts)
    loader = tailcut.pool.PooledLoader(ds, loaders_per_host=args.loaders, batch_size=BATCH,
                                        collate_fn=collate, slot_bytes=BATCH * 8, num_slots=8,
                                        timeout=120, carry_over=False)
    epochs = []
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        dist.barrier()
        t0 = time.perf_counter()
        trained = 0
        for batch in loader:
            trained += len(batch)
            time.sleep(args.step_ms / 1e3)
            dist.all_reduce(torch.ones(1))
        seconds = time.perf_counter() - t0
        report = loader.reports[-1]
        epochs.append(dict(seconds=seconds, trained=trained, steps=report["steps"],
                           left_over=report["leftover_records"]))
    loader.close()
    ds.close()
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, (node, epochs))
    if rank == 0:
        pathlib.Path(args.result).write_text(json.dumps(every))
    dist.barrier()
    dist.destroy_process_group()


# ---- the driver ----------------------------------------------------------------------------------


def write_data(data, records):
    import numpy as np
    per_file = records // FILES
    for f in range(FILES):
        np.arange(f * per_file, (f + 1) * per_file, dtype=np.int64).tofile(data / f"part-{f}.bin")


def start_redis(workdir):
    port = free_port()
    proc = subprocess.Popen([shutil.which("redis-server"), "--bind", "127.0.0.1", "--port",
                             str(port), "--dir", workdir, "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"redis://127.0.0.1:{port}/0"
        time.sleep(0.01)
    proc.kill()
    raise RuntimeError("redis-server did not start")


def run(args, data, tmp, url, mode, case, job):
    """One job of 2 nodes x 2 ranks; returns [(node, epochs)] per rank."""
    result = pathlib.Path(tmp) / f"{job}.json"
    port = free_port()
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    common = ["--rank-main", "--mode", mode, "--case", case, "--job", job, "--data", str(data),
              "--result", str(result)] + [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in (
                  "records", "epochs", "loaders", "record_us", "step_ms", "slices", "block")]
    procs = []
    for node in range(2):
        node_env = dict(env)
        if mode == "fed":
            node_env.update(TAILCUT_COORDINATOR=url, TAILCUT_HOST_ID=f"n{node}")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank",
             str(node), "--nproc_per_node=2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
             f"127.0.0.1:{port}", "--rdzv_id", job, "--redirects", "1", "--tee", "2",
             "--monitor_interval=0.2", os.path.abspath(__file__)] + common,
            env=node_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for p in procs:
        out, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"{mode} {case}: torchrun failed\n{out[-3000:]}")
    return json.loads(result.read_text())


def summarize(ranks):
    """Rank 0's median epoch time over epochs 1.., and records trained per second."""
    epochs = ranks[0][1][1:]
    seconds = statistics.median(e["seconds"] for e in epochs)
    trained = sum(e["trained"] for _, r in ranks for e in r[1:])
    left = sum(e["left_over"] for _, r in ranks for e in r[1:])
    return dict(seconds=seconds, records_per_s=trained / sum(e["seconds"] for e in epochs),
                left_over_per_epoch=left / len(epochs), steps=epochs[0]["steps"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode"), ap.add_argument("--case"), ap.add_argument("--job")
    ap.add_argument("--data"), ap.add_argument("--result")
    ap.add_argument("--records", type=int, default=32_000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--loaders", type=int, default=2, help="loader processes per node")
    ap.add_argument("--record-us", type=float, default=200.0)
    ap.add_argument("--step-ms", type=float, default=3.0)
    ap.add_argument("--slices", type=int, default=64)
    ap.add_argument("--block", type=int, default=2, help="tickets per block of the coordinator")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cases", default="slow_loaders,slow_files,balanced")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.rank_main:
        return rank_main(args)
    if shutil.which("redis-server") is None:
        sys.exit("fed_hosts.py: redis-server is not installed (apt-get install redis-server)")
    cases = args.cases.split(",")
    runs = []
    with tempfile.TemporaryDirectory(prefix="tailcut-fed-bench-") as tmp:
        data = pathlib.Path(tmp) / "data"
        data.mkdir()
        write_data(data, args.records)
        redis, url = start_redis(tmp)
        try:
            for repeat in range(args.repeats):
                for c, case in enumerate(cases):
                    modes = ("static", "fed") if (repeat + c) % 2 == 0 else ("fed", "static")
                    for mode in modes:
                        job = f"fedbench-{os.getpid()}-{repeat}-{case}-{mode}"
                        s = summarize(run(args, data, tmp, url, mode, case, job))
                        runs.append(dict(repeat=repeat, case=case, mode=mode, **s))
                        print(f"repeat {repeat} {case:12s} {mode:6s} epoch {s['seconds']:.2f} s, "
                              f"{s['records_per_s']:.0f} records/s trained, "
                              f"{s['left_over_per_epoch']:.0f} left over per epoch", flush=True)
        finally:
            redis.kill()
            redis.wait()
    print(f"\n{'case':12s} {'static s':>16s} {'fed s':>16s} {'epoch static/fed':>22s} "
          f"{'trained/s fed/static':>22s}")
    summary = {}
    for case in cases:
        def of(mode, key):
            return [r[key] for r in runs if r["case"] == case and r["mode"] == mode]
        epoch_ratio = [a / b for a, b in zip(of("static", "seconds"), of("fed", "seconds"))]
        rate_ratio = [b / a for a, b in zip(of("static", "records_per_s"),
                                            of("fed", "records_per_s"))]

        def med(v, fmt):
            return f"{statistics.median(v):{fmt}} [{min(v):{fmt}}, {max(v):{fmt}}]"
        summary[case] = dict(static_s=of("static", "seconds"), fed_s=of("fed", "seconds"),
                             epoch_ratio=epoch_ratio, trained_rate_ratio=rate_ratio)
        print(f"{case:12s} {med(of('static', 'seconds'), '.2f'):>16s} "
              f"{med(of('fed', 'seconds'), '.2f'):>16s} {med(epoch_ratio, '.3f'):>22s} "
              f"{med(rate_ratio, '.3f'):>22s}")
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(dict(args=vars(args), runs=runs,
                                                          summary=summary), indent=1))


if __name__ == "__main__":
    main()
