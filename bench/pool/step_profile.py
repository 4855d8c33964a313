"""Where the microseconds of a pooled step go: a rank's next() from the call
to the batch in its hands, taken apart, and a loader's publish.

    PYTHONPATH=build/python python3 bench/pool/step_profile.py [--batches 3000]
        [--step-us 0] [--repeats 3] [--strace] [--out DIR]

One rank (world_size 1) iterates a PooledLoader over a QueueDataset of fixed
64-byte records (batch 32: a 2 KiB batch, so that the hand-off and not the
bytes is what is timed), fed by --loaders loader processes. The ring has a
slot for every timed batch (--slots, default --batches + 16) and the rank
starts timing once the loaders have filled it, so that a batch is ready
whenever it asks: what is timed is the cost of taking a ready batch, as in a
step that did not wait for its loaders. --step-us sleeps that long between
two next() calls (a step; default 0: back to back, as bench/pool/handoff.py
times the bare hand-off).

full      next(it) on the loader's iterator, as a training loop calls it (wall
          and the thread's CPU time, per call).
stages    The same steps done by hand in the next epoch, on the same live ring
          and step agreement, with the loader's own methods, one batch at a
          time, each stage timed on its own (perf_counter_ns around it, the
          timer's own cost subtracted):
            pop        the ring's next batch (PooledLoader._pop: the C++ pop, and
                       the look at the loaders' failure record when it is due)
            hand_out   the batch as the caller's own tensors (_tensors, _owned:
                       the slot header read, the copy, torch.from_numpy)
            (decode)   of which decode_batch alone (timed again on its own)
            agree      StepAgreement.agree with every rank holding a batch
            clock      metrics' per-step clock (StepClock.timed's bookkeeping)
            release    _release_current: the last batch's slot back to the ring
          The rest of `full` (full minus the stages) is the generators' own
          Python. A build without PooledLoader._pop is timed the way it worked:
          _lifecycle.pop, then a view and its copy.
publish   A forked process publishing pre-encoded batches as fast as the ring
          lets it, stage by stage: acquire, encode_batch (with the batch's
          record ranges), publish.

--strace counts the system calls of the rank's main thread over the `full`
window (strace -c attached to it; slows it down: the timing of that run is not
used) and prints them per next().
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch


def pct(v, q):
    return float(np.percentile(np.asarray(v, dtype=float), q))


def make_file(path, records, record_bytes):
    np.random.default_rng(0).integers(0, 255, (records, record_bytes),
                                      dtype=np.uint8).tofile(path)


def open_loader(args, path, name):
    import tailcut.torch as tt
    from tailcut.pool import PooledLoader
    ds = tt.QueueDataset([path], name=name, format="fixed", record_bytes=args.record_bytes,
                         num_slices=64, num_epochs=2, seed=1)
    return PooledLoader(ds, batch_size=args.batch, loaders_per_host=args.loaders,
                        num_slots=args.slots, slot_bytes=args.batch * args.record_bytes + 4096,
                        rank=0, world_size=1, local_rank=0, local_world_size=1)


def wait_full(loader, want):
    """Waits until the ring holds `want` ready batches (the loaders ahead)."""
    deadline = time.monotonic() + 30
    while loader.ring.stats()["ready"] < want and time.monotonic() < deadline:
        time.sleep(0.01)


def timer_cost():
    ns = time.perf_counter_ns
    v = []
    for _ in range(10000):
        a = ns()
        b = ns()
        v.append(b - a)
    return statistics.median(v)


def run_full(loader, args, strace_out=None):
    """Epoch 0: next() timed per call, a sleep of step_us between calls."""
    it = iter(loader)
    first = next(it)  # starts the loaders
    del first
    wait_full(loader, min(args.slots - 2, args.batches))
    tracer = None
    if strace_out:
        tracer = subprocess.Popen(["strace", "-c", "-o", strace_out, "-p", str(os.getpid())],
                                  stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # attached
    wall, cpu = [], []
    step = args.step_us / 1e6
    pc, tt_ = time.perf_counter, time.thread_time
    for _ in range(args.batches):
        if step:
            time.sleep(step)
        t0, c0 = pc(), tt_()
        b = next(it, None)
        t1, c1 = pc(), tt_()
        if b is None:
            break
        wall.append(t1 - t0)
        cpu.append(c1 - c0)
    if tracer is not None:
        tracer.send_signal(signal.SIGINT)
        tracer.wait()
    for _ in it:  # the rest of the epoch
        pass
    return wall, cpu


def run_stages(loader, args, tcost):
    """Epoch 1 by hand, with the loader's own methods: each stage of a step
    timed on its own."""
    from tailcut._batch_layout import decode_batch
    import tailcut.pool._lifecycle as _lifecycle
    from tailcut.pool._metrics import batch_samples

    epoch = 1
    steps = loader._agreement()
    loader.start_loaders()
    wait_full(loader, min(args.slots - 2, args.batches))
    if hasattr(loader, "_pop"):  # this version: a ready batch taken without a look at failures
        loader._failure_check_at = 0.0
        pop = loader._pop

        def hand_out(batch):
            return loader._owned(loader._tensors(batch, copy=True), copied=True)
    else:  # older: the waiting pop every time, a view then its copy
        def pop(epoch):
            return _lifecycle.pop(loader.ring, loader.name, epoch, loader.timeout, True,
                                  loader.loaders, loader.queue)

        def hand_out(batch):
            return loader._owned(loader._tensors(batch))
    ns = time.perf_counter_ns
    stages = {k: [] for k in ("pop", "hand_out", "agree", "clock", "release", "(decode)")}
    kept = []
    step = 0
    while step < args.batches:
        if args.step_us:
            time.sleep(args.step_us / 1e6)
        a = ns()
        batch = pop(epoch)
        b = ns()
        if batch is None:
            break
        mine = hand_out(batch)
        c = ns()
        ok = steps.agree(epoch, step, True)
        d = ns()
        kept.append((d, d - a, batch_samples(mine)))
        e = ns()
        decode_batch(batch.data, batch.header)  # a part of hand_out, timed again alone
        f = ns()
        loader._current = [batch]
        g = ns()
        loader._release_current()
        h = ns()
        assert ok
        step += 1
        for key, x, y in (("pop", a, b), ("hand_out", b, c), ("agree", c, d), ("clock", d, e),
                          ("(decode)", e, f), ("release", g, h)):
            stages[key].append(max(0, y - x - tcost) / 1e3)
    for _ in range(100000):  # the rest of the epoch, so that close() is quiet
        batch = loader.ring.pop(through_epoch=epoch, timeout=5.0)
        if batch is None:
            break
        loader.ring.release(batch)
    steps.agree(epoch, step, False)
    return stages


def publisher(name, args, count, out_path):
    """The forked loader side: acquire, encode_batch, publish, each timed."""
    from tailcut import _core
    from tailcut._batch_layout import encode_batch
    ring = _core.BatchRing(name, args.batch * args.record_bytes + 4096, args.slots, "loader")
    src = np.arange(args.batch * args.record_bytes, dtype=np.int64).astype(np.uint8).reshape(
        args.batch, args.record_bytes)
    ranges = [(7, 0, args.batch)]
    ns = time.perf_counter_ns
    times = {"acquire": [], "encode": [], "publish": []}
    for _ in range(count):
        a = ns()
        slot = ring.acquire()
        b = ns()
        nbytes = encode_batch(src, slot.data, slot.header, ranges)
        c = ns()
        ring.publish(slot, 0, args.batch, nbytes)
        d = ns()
        times["acquire"].append((b - a) / 1e3)
        times["encode"].append((c - b) / 1e3)
        times["publish"].append((d - c) / 1e3)
    ring.end_epoch(0)
    ring.close()
    with open(out_path, "w") as f:
        json.dump(times, f)


def run_publish(args):
    import tailcut
    from tailcut import _core
    name = f"step-profile-pub-{os.getpid()}"
    out_path = tempfile.mktemp(prefix="step_profile_pub", suffix=".json")
    pid = os.fork()  # before this process opens the ring (the ring's fork rule)
    if pid == 0:
        code = 1
        try:
            publisher(name, args, args.batches, out_path)
            code = 0
        finally:
            os._exit(code)
    ring = _core.BatchRing(name, args.batch * args.record_bytes + 4096, args.slots, "trainer")
    try:
        while True:
            b = ring.pop(through_epoch=0, timeout=60)
            if b is None:
                break
            ring.release(b)
    finally:
        ring.close()
        _, status = os.waitpid(pid, 0)
        tailcut.remove_batch_ring(name)
    assert status == 0
    with open(out_path) as f:
        times = json.load(f)
    os.unlink(out_path)
    return times


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, default=3000, help="timed next() calls per repeat")
    p.add_argument("--step-us", type=float, default=0.0, help="the rank's step (a sleep)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--loaders", type=int, default=2)
    p.add_argument("--slots", type=int, default=None, help="default --batches + 16")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--record-bytes", type=int, default=64)
    p.add_argument("--strace", action="store_true", help="count the syscalls per next()")
    p.add_argument("--out", default=None, help="directory for step_profile.json")
    args = p.parse_args()
    if args.slots is None:
        args.slots = args.batches + 16
    torch.set_num_threads(1)
    import tailcut
    print(f"load average at start {os.getloadavg()}, {os.cpu_count()} CPUs", file=sys.stderr)
    tmp = tempfile.mkdtemp(prefix="step_profile")
    path = os.path.join(tmp, "records.bin")
    # Two epochs of a little more than the timed batches, whole batches.
    make_file(path, (args.batches + args.slots + 8) * args.batch, args.record_bytes)
    tcost = timer_cost()
    results = {"full_wall_us": [], "full_cpu_us": [], "stages": [], "publish": []}
    for rep in range(args.repeats + (1 if args.strace else 0)):
        name = f"step-profile-{os.getpid()}-{rep}"
        loader = open_loader(args, path, name)
        strace_out = os.path.join(tmp, "strace.txt") if args.strace and rep == 0 else None
        try:
            wall, cpu = run_full(loader, args, strace_out)
            stages = run_stages(loader, args, tcost)
        finally:
            loader.close()
            loader.dataset.close()
            for remove in (lambda: tailcut.remove_queue(name, force=True),):
                try:
                    remove()
                except tailcut.NotFoundError:
                    pass
        if strace_out:
            with open(strace_out) as f:
                text = f.read()
            os.unlink(strace_out)
            print(f"system calls of the rank's main thread over {len(wall)} next() calls "
                  f"(strace -c; the loop's own: 2 clock_gettime per call, thread_time)",
                  file=sys.stderr)
            for line in text.splitlines():
                parts = line.split()
                if len(parts) >= 5 and parts[3].isdigit():
                    calls = int(parts[3])
                    print(f"  {parts[-1]:20s} {calls:8d} calls  {calls / max(len(wall), 1):6.2f} "
                          f"per next()", file=sys.stderr)
            continue
        results["full_wall_us"].append([w * 1e6 for w in wall])
        results["full_cpu_us"].append([c * 1e6 for c in cpu])
        results["stages"].append(stages)
        results["publish"].append(run_publish(args))
        print(f"  rep {rep}: next() wall p50 {pct(wall, 50) * 1e6:.1f} us, p90 "
              f"{pct(wall, 90) * 1e6:.1f} us, CPU p50 {pct(cpu, 50) * 1e6:.1f} us",
              file=sys.stderr, flush=True)
    os.unlink(path)
    os.rmdir(tmp)
    if not results["stages"]:
        return
    # Per repeat: the median of each; then the median over repeats (min-max).
    def summary(per_rep):
        meds = [statistics.median(v) for v in per_rep]
        return statistics.median(meds), min(meds), max(meds)

    rows = []
    full = summary(results["full_wall_us"])
    rows.append(("next() wall, full", full))
    rows.append(("next() thread CPU, full", summary(results["full_cpu_us"])))
    staged_total = 0.0
    for key in results["stages"][0]:
        s = summary([r[key] for r in results["stages"]])
        if not key.startswith("("):  # a part of another stage
            staged_total += s[0]
        rows.append(("  " + key, s))
    rows.append(("  sum of the stages", (staged_total, staged_total, staged_total)))
    rows.append(("  rest: the generators' Python", (full[0] - staged_total,) * 3))
    for key in results["publish"][0]:
        rows.append(("publish: " + key, summary([r[key] for r in results["publish"]])))
    print(f"\nper call, us: median over {args.repeats} repeats of the median (min-max); "
          f"timer cost {tcost:.0f} ns subtracted from each stage", file=sys.stderr)
    for what, (med, lo, hi) in rows:
        print(f"  {what:34s} {med:8.2f}  ({lo:.2f}-{hi:.2f})", file=sys.stderr)
    print(f"load average at the end {os.getloadavg()}", file=sys.stderr)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "step_profile.json"), "w") as f:
            json.dump(dict(args=vars(args), rows=rows, timer_ns=tcost), f, indent=1)


if __name__ == "__main__":
    main()
