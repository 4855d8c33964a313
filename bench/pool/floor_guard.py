"""The pool's regression guard: pooled / floor per version, run alternately.

    bench/pool/floor_guard.py --version ea1f9bb=/tmp/old/build/python \\
        --version main=build/python [--rounds 3] [--port 29611] [--out DIR]

Each --version is NAME=DIR, DIR a built Python package (build/python of a
build of that version; build one, e.g. an older commit, in a git worktree of
its own: `git worktree add --detach /tmp/old COMMIT && cmake -S /tmp/old -B
/tmp/old/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTAILCUT_BUILD_TESTS=OFF
-DTAILCUT_BUILD_BENCHMARKS=OFF -DTAILCUT_BUILD_TOOLS=OFF && cmake --build
/tmp/old/build --target _core`). The benchmark script is this checkout's
bench/pool/ddp_pooled.py for every version (it speaks each version's
PooledLoader arguments), so that only the package differs.

The case (issue "the pool at the floor"): 4 torchrun ranks, gloo, synchronous
DDP, TFRecord input, a heavy-tailed per-batch transform (lognormal, mean
--mean-ms 50, sigma 1), --step-ms 5 steps; 8 pooled loaders against
DataLoader(num_workers=2) per rank, and the floor (the same steps over a batch
already in memory). Every round runs each version once, the order
alternating round by round; each run is one ddp_pooled.py repeat of --epochs
epochs (epoch 0, which starts the loaders, is left out: the mean of the
others is the run's epoch). The transform's costs are drawn from the round's
seed: every version of a round gets the same draws, and the rounds differ
(with one seed for all, as before, every run of a version repeated the same
epochs to within 1 %, and three rounds were one sample).

Prints per version and round: floor, pooled and per-rank epochs, pooled /
floor, per_rank / pooled and the share of the pooled loaders' time spent in
the transform (ddp_pooled.py --trace-loaders: 1.0 when no loader ever idled,
so pooled / (the loaders' bound) is about 1 / that share); then per version the median over rounds
(min-max), and per round each version's pooled epoch over the first
version's (the same round: the machine's load cancels). Targets: pooled /
floor <= 1.10 (median), per_rank / pooled >= 1.8, and no version slower
than the first. The load average at each run's start and end is printed:
the machine may be shared.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def run_once(name, pkg, args, port, out, seed):
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", PYTHONPATH=os.path.abspath(pkg),
               OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
           "--nproc_per_node", str(args.ranks), "--rdzv_backend", "c10d", "--rdzv_endpoint",
           f"localhost:{port}", "--redirects", "1", "--tee", "2",
           os.path.join(HERE, "ddp_pooled.py"), "--cases", "a", "--repeats", "1",
           "--epochs", str(args.epochs), "--mean-ms", str(args.mean_ms), "--step-ms",
           str(args.step_ms), "--workers-per-rank", str(args.workers_per_rank), "--slots",
           str(args.slots), "--format",
           "tfrecord", "--records", str(args.records), "--seed", str(seed),
           "--trace-loaders", out + ".trace", "--out", out]
    os.makedirs(out + ".trace", exist_ok=True)
    load0 = os.getloadavg()[0]
    res = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=args.run_timeout)
    load1 = os.getloadavg()[0]
    with open(os.path.join(out + ".log"), "w") as f:
        f.write(res.stderr)
    if res.returncode != 0:  # a finding too: counted, and the run's rank 0 shown
        first = [ln for ln in res.stderr.splitlines() if ln.startswith("[default0]")]
        print(f"{name}: ddp_pooled.py failed ({res.returncode}); log {out}.log; rank 0's "
              f"last lines:\n" + "\n".join(first[-25:]), file=sys.stderr, flush=True)
        return None
    with open(os.path.join(out, "results.json")) as f:
        rows = json.load(f)["epochs"]

    def epoch(case, mode):  # the mean of epochs 1..: the run's pace over all of them
        return statistics.mean(r["seconds"] for r in rows
                               if r["case"] == case and r["mode"] == mode and r["epoch"] >= 1)
    floor, pooled, per_rank = epoch("floor", "no_data"), epoch("a", "pooled"), epoch("a", "per_rank")
    busy = statistics.mean(r["loaders_busy"] for r in rows
                           if r["mode"] == "pooled" and r["epoch"] >= 1)
    return dict(floor=floor, pooled=pooled, per_rank=per_rank, over_floor=pooled / floor,
                per_rank_over_pooled=per_rank / pooled, loaders_busy=busy, load=(load0, load1))


def med_range(v, fmt="{:.2f}"):
    return f"{fmt.format(statistics.median(v))} ({fmt.format(min(v))}-{fmt.format(max(v))})"


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="append", required=True, metavar="NAME=DIR",
                   help="a built Python package to measure; the first is the baseline")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--records", type=int, default=12800)
    p.add_argument("--mean-ms", type=float, default=50.0)
    p.add_argument("--step-ms", type=float, default=5.0)
    p.add_argument("--workers-per-rank", type=int, default=2)
    p.add_argument("--slots", type=int, default=32, help="the pooled ring's batch slots")
    p.add_argument("--port", type=int, default=29611, help="the rendezvous port")
    p.add_argument("--run-timeout", type=float, default=600.0)
    p.add_argument("--out", default=None,
                   help="directory for floor_guard.json and each run's output (default: a "
                        "new directory in /tmp, kept)")
    args = p.parse_args()
    versions = []
    for v in args.version:
        name, sep, pkg = v.partition("=")
        if not sep or not os.path.isdir(os.path.join(pkg, "tailcut")):
            p.error(f"--version {v!r}: expected NAME=DIR, DIR holding the built tailcut package")
        versions.append((name, pkg))
    print(f"load average at start {os.getloadavg()}, {os.cpu_count()} CPUs", file=sys.stderr)
    runs = {name: [] for name, _ in versions}
    failed = {name: 0 for name, _ in versions}
    tmp = args.out or tempfile.mkdtemp(prefix="floor_guard")
    os.makedirs(tmp, exist_ok=True)
    print(f"each run's output in {tmp}", file=sys.stderr)
    for rnd in range(args.rounds):
        order = versions if rnd % 2 == 0 else versions[::-1]
        for name, pkg in order:
            out = os.path.join(tmp, f"{name}-{rnd}")
            r = run_once(name, pkg, args, args.port, out, rnd)
            if r is None:
                failed[name] += 1
                r = run_once(name, pkg, args, args.port, out + "b", rnd)
                if r is None:
                    sys.exit(f"{name} failed twice in round {rnd}")
            runs[name].append(r)
            print(f"  round {rnd} {name:10s}: floor {r['floor']:.2f} s, pooled "
                  f"{r['pooled']:.2f} s, per-rank {r['per_rank']:.2f} s; pooled/floor "
                  f"{r['over_floor']:.2f}, per_rank/pooled {r['per_rank_over_pooled']:.2f}, "
                  f"loaders in the transform {r['loaders_busy']:.1%} "
                  f"(load {r['load'][0]:.1f} -> {r['load'][1]:.1f})",
                  file=sys.stderr, flush=True)
    base = versions[0][0]
    print(f"\n{args.rounds} rounds, alternating; median (min-max) over rounds", file=sys.stderr)
    print(f"{'version':12s} {'floor s':>18s} {'pooled s':>18s} {'pooled/floor':>18s} "
          f"{'per_rank/pooled':>18s} {'pooled / ' + base:>20s} {'loaders busy':>18s}",
          file=sys.stderr)
    for name, _ in versions:
        rs = runs[name]
        vs_base = [r["pooled"] / b["pooled"] for r, b in zip(rs, runs[base])]
        print(f"{name:12s} {med_range([r['floor'] for r in rs]):>18s} "
              f"{med_range([r['pooled'] for r in rs]):>18s} "
              f"{med_range([r['over_floor'] for r in rs]):>18s} "
              f"{med_range([r['per_rank_over_pooled'] for r in rs]):>18s} "
              f"{med_range(vs_base, '{:.3f}'):>20s} "
              f"{med_range([r['loaders_busy'] for r in rs], '{:.3f}'):>18s}", file=sys.stderr)
    print("targets: pooled/floor <= 1.10, per_rank/pooled >= 1.8, no version slower than "
          f"{base} in the same round", file=sys.stderr)
    for name, _ in versions:
        rs = runs[name]
        over = statistics.median(r["over_floor"] for r in rs)
        ratio = statistics.median(r["per_rank_over_pooled"] for r in rs)
        slower = sum(r["pooled"] > b["pooled"] for r, b in zip(rs, runs[base]))
        print(f"  {name}: pooled/floor {over:.2f} {'met' if over <= 1.10 else 'NOT met'}; "
              f"per_rank/pooled {ratio:.2f} {'met' if ratio >= 1.8 else 'NOT met'}"
              + ("" if name == base else f"; slower than {base} in {slower} of {len(rs)} "
                 f"rounds"), file=sys.stderr)
    print(f"failed runs (each run again once): {failed}", file=sys.stderr)
    print(f"load average at the end {os.getloadavg()}", file=sys.stderr)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "floor_guard.json"), "w") as f:
            json.dump(dict(args=vars(args), versions=versions, runs=runs, failed=failed), f,
                      indent=1)


if __name__ == "__main__":
    main()
