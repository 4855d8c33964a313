"""A picture of a pooled job's input pipeline, to look at or attach to a bug report.

    python3 -m tailcut.plot RING OUT.png [--seconds 60] [--interval 0.25]

Watches the batch ring RING (a PooledLoader's is '<job>.pool') for --seconds, or until the ring
is removed, reading its shared counters every --interval s as `tailcut top` does, then draws two
panels over time: each rank's data wait (the share of each interval it waited for a batch) and
each loader's wait for a free slot, and the number of live loaders. Needs matplotlib.
"""

import argparse
import sys
import time

import tailcut


def watch(ring, seconds, interval):
    """[(t, {(role, pid): cumulative wait seconds}, live loaders)] sampled every `interval` s
    for `seconds`, or until the ring is gone."""
    samples, t0 = [], time.monotonic()
    while time.monotonic() - t0 < seconds:
        try:
            stats = tailcut.inspect_batch_ring(ring)
        except tailcut.NotFoundError:
            break
        waits = {(c["role"], c["pid"]): c["wait_seconds"] + c["waiting_seconds"]
                 for c in stats["clients"] if c["alive"]}
        loaders = sum(role == "loader" for role, _ in waits)
        samples.append((time.monotonic() - t0, waits, loaders))
        time.sleep(interval)
    return samples


def wait_shares(samples):
    """{(role, pid): ([t], [share of the interval before t spent waiting])}."""
    series = {}
    for (t0, before, _), (t1, after, _) in zip(samples, samples[1:]):
        for key, waited in after.items():
            if key in before and waited >= before[key] and t1 > t0:
                ts, shares = series.setdefault(key, ([], []))
                ts.append(t1)
                shares.append(min((waited - before[key]) / (t1 - t0), 1.0))
    return series


def draw(ring, samples, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = wait_shares(samples)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True,
                                      gridspec_kw=dict(height_ratios=[3, 1]))
    for (role, pid), (ts, shares) in sorted(series.items()):
        if role == "trainer":
            top.plot(ts, [100 * s for s in shares], lw=2, label=f"rank (pid {pid}): data wait")
        else:
            top.plot(ts, [100 * s for s in shares], lw=1, ls="--",
                     label=f"loader {pid}: wait for a free slot")
    top.set_ylabel("% of each interval")
    top.set_ylim(-2, 102)
    top.set_title(f"batch ring '{ring}': who waited for whom")
    if series:
        top.legend(fontsize=7, loc="upper right")
    counts = [n for _, _, n in samples]
    bottom.step([t for t, _, _ in samples], counts, where="post")
    bottom.set_ylim(0, max(counts) + 1)
    bottom.yaxis.get_major_locator().set_params(integer=True)
    bottom.set_ylabel("live loaders")
    bottom.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python3 -m tailcut.plot",
        description="Watch a batch ring of pooled loaders and draw each rank's data wait, each "
                    "loader's wait for a free slot and the live loaders over time into a PNG.")
    parser.add_argument("ring", help="the batch ring (a PooledLoader's is '<job>.pool')")
    parser.add_argument("out", help="the PNG to write")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="how long to watch (default 60; it stops early when the ring goes)")
    parser.add_argument("--interval", type=float, default=0.25,
                        help="seconds between two readings (default 0.25)")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.interval <= 0:
        parser.error("--seconds and --interval must be positive")
    try:
        tailcut.inspect_batch_ring(args.ring)
    except tailcut.Error as e:
        print(f"tailcut.plot: {e}", file=sys.stderr)
        return 1
    print(f"tailcut.plot: watching batch ring '{args.ring}' for up to {args.seconds:g} s "
          f"(Ctrl-C draws what it has)", file=sys.stderr, flush=True)
    try:
        samples = watch(args.ring, args.seconds, args.interval)
    except KeyboardInterrupt:
        samples = []
    if len(samples) < 2:
        print(f"tailcut.plot: batch ring '{args.ring}' was read fewer than twice; nothing to "
              f"draw", file=sys.stderr)
        return 1
    draw(args.ring, samples, args.out)
    print(f"tailcut.plot: {args.out}: {len(samples)} readings over {samples[-1][0]:.1f} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
