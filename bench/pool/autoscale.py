#!/usr/bin/env python3
"""Adds pooled loaders to a running job when its trainers starve.

Every --interval seconds it reads the job's batch ring (tailcut.inspect_batch_ring, the
counters `tailcut ring NAME` shows). When no batch is ready and the live trainers spent more
than --starve of that interval waiting for one, it starts one more loader process with
`python3 -m tailcut.pool --ring NAME` (up to --max-loaders), says what it saw and did, and
then leaves the new loader --cooldown intervals to start before it adds another. It stops
when the ring is gone (the job ended) and waits for the loaders it added.

    python3 bench/pool/autoscale.py --ring NAME        # watch a running job on this host
    python3 bench/pool/autoscale.py --demo             # start a small job and watch it

--demo starts a one-rank job: a PooledLoader with one loader process whose transform takes
--cost-ms per batch, and a trainer that needs --step-ms per step, so that it starves. The
trainer checks that every record of every epoch reached it exactly once and prints each
epoch's time; the exit status is the trainer's. docs/pooled.md shows a run.
"""

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time

import tailcut

_RECORD = 16


def costly(batch):
    """The demo's transform: $AUTOSCALE_COST_MS of work per batch (a sleep)."""
    time.sleep(float(os.environ.get("AUTOSCALE_COST_MS", "20")) / 1e3)
    return batch


def say(t0, text):
    print(f"[{time.monotonic() - t0:6.2f} s] {text}", flush=True)


def watch(ring, loader_cmd, *, interval, starve, max_loaders, cooldown, job=None):
    """Watches `ring` until it is gone (or the process `job` exits); returns the loaders added."""
    t0 = time.monotonic()
    added, last, quiet_until, seen = [], None, 0.0, False
    while job is None or job.poll() is None:
        try:
            s = tailcut.inspect_batch_ring(ring)
        except tailcut.NotFoundError:
            if seen:
                say(t0, f"ring '{ring}' is gone: the job ended")
                break
            time.sleep(interval)  # the job has not opened it yet
            continue
        seen = True
        now = time.monotonic()
        live = [c for c in s["clients"] if c["alive"]]
        trainers = [c for c in live if c["role"] == "trainer"]
        loaders = sum(c["role"] == "loader" for c in live)
        # Waits done plus the one in progress: a trainer starved for the whole
        # interval has not finished its wait yet.
        waited = sum(c["wait_seconds"] + c.get("waiting_seconds", 0.0) for c in trainers)
        if last is not None and trainers:
            span = now - last[0]
            share = max(waited - last[1], 0.0) / (span * len(trainers))
            if s["ready"] == 0 and share > starve:
                if len(added) >= max_loaders:
                    pass  # at the limit: nothing more to do
                elif now < quiet_until:
                    pass  # the last loader added is still starting
                else:
                    p = subprocess.Popen(loader_cmd)
                    added.append(p)
                    quiet_until = now + cooldown * interval
                    say(t0, f"starving: 0 of {s['num_slots']} batches ready, {len(trainers)} "
                            f"trainer(s) waited {share:.0%} of the last {span:.2f} s, {loaders} "
                            f"loader(s): adding loader {len(added)} of at most {max_loaders} "
                            f"(pid {p.pid})")
        last = (now, waited)
        time.sleep(interval)
    for p in added:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.terminate()  # the loader command publishes what it holds, then leaves
            p.wait()
    say(t0, f"added {len(added)} loader(s); exit status {[p.returncode for p in added]}")
    return added


def trainer(args):
    """The demo's job: one rank, one loader of its own, --epochs epochs."""
    import numpy as np

    import tailcut.torch as tt
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        os.environ.pop(var, None)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ids.bin")
        data = np.zeros((args.records, _RECORD), np.uint8)
        data[:, :8] = np.arange(args.records, dtype=np.uint64).view(np.uint8).reshape(-1, 8)
        data.tofile(path)
        ds = tt.QueueDataset([path], name=args.name, format="fixed", record_bytes=_RECORD,
                             num_slices=args.records // 50, num_epochs=args.epochs,
                             num_clients=1)
        loader = tt.PooledLoader(ds, num_workers=1, batch_size=args.batch, transform=costly,
                                 slot_bytes=args.batch * _RECORD, num_slots=8, timeout=120)
        ok = True
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            seen = np.zeros(args.records, np.int64)
            start, waited, steps = time.monotonic(), 0.0, 0
            t = time.monotonic()
            for batch in loader:
                waited += time.monotonic() - t
                seen[batch[:, :8].numpy().copy().view(np.uint64).ravel()] += 1
                steps += 1
                time.sleep(args.step_ms / 1e3)  # the training step
                t = time.monotonic()
            once = bool((seen == 1).all())
            ok &= once
            print(f"trainer: epoch {epoch}: {int(seen.sum())} records in {steps} steps in "
                  f"{time.monotonic() - start:.2f} s, {waited:.2f} s waiting for batches; "
                  f"{'every record once' if once else 'RECORDS MISSING OR REPEATED'}",
                  flush=True)
        loader.close()
        ds.close()
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--ring", help="the batch ring of the job to watch")
    p.add_argument("--demo", action="store_true", help="start a small job and watch it")
    p.add_argument("--interval", type=float, default=0.2, help="seconds between looks")
    p.add_argument("--starve", type=float, default=0.5,
                   help="add a loader when trainers waited more than this share of the interval")
    p.add_argument("--max-loaders", type=int, default=3, help="loaders to add at most")
    p.add_argument("--cooldown", type=int, default=3,
                   help="intervals to leave a new loader before adding another")
    p.add_argument("--loader-args", default="",
                   help="more arguments for `python3 -m tailcut.pool` (e.g. --transform M:F)")
    p.add_argument("--records", type=int, default=4000, help="demo: records per epoch")
    p.add_argument("--epochs", type=int, default=2, help="demo: epochs")
    p.add_argument("--batch", type=int, default=32, help="demo: records per batch")
    p.add_argument("--cost-ms", type=float, default=20.0, help="demo: transform time per batch")
    p.add_argument("--step-ms", type=float, default=2.0, help="demo: training step time")
    p.add_argument("--trainer", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--name", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.trainer:
        return trainer(args)
    if not args.demo and not args.ring:
        p.error("give --ring NAME (a running job) or --demo")
    cmd = [sys.executable, "-m", "tailcut.pool", "--ring"]
    extra = shlex.split(args.loader_args)
    job = None
    if args.demo:
        # The job's transform is defined here, in what is the job's main script:
        # the loaders are told where to import it from.
        os.environ["AUTOSCALE_COST_MS"] = str(args.cost_ms)
        args.name = f"autoscale-demo-{os.getpid()}"
        args.ring = f"{args.name}.pool"
        extra += ["--transform", f"{os.path.abspath(__file__)}:costly"]
        job = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--trainer",
                                "--name", args.name, "--records", str(args.records),
                                "--epochs", str(args.epochs), "--batch", str(args.batch),
                                "--step-ms", str(args.step_ms)])
        print(f"demo: one trainer ({args.step_ms} ms per step) and one loader ({args.cost_ms} "
              f"ms per batch of {args.batch}) on ring '{args.ring}'", flush=True)
    watch(args.ring, cmd + [args.ring] + extra, interval=args.interval, starve=args.starve,
          max_loaders=args.max_loaders, cooldown=args.cooldown, job=job)
    if job is not None:
        return job.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
