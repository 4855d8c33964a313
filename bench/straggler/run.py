#!/usr/bin/python3
"""Runs the straggler sweep and draws the plots for docs/straggler.md.

    bench/straggler/run.py --bench build/bin/straggler_bench [--reps 3] [--key-reps 5]

For P in {4, 8} and k in {1, 2, 4, 8}: static sharding (10 x P slices),
elastic (10 x P slices), elastic + tail splitting (10 x P and P slices), one
slow process, the same data set; repetition r uses shuffle seed r + 1 (the
item order decides where the slow process's last item ends). Writes docs/straggler_results.csv (one row
per run), prints a table of medians, and draws docs/img/straggler_makespan.png
and docs/img/straggler_gantt.png (from the first P=8, k=4 repetition).
Needs only the standard library and matplotlib.
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = [  # (label, strategy, slices per process)
    ("static", "static", 10),
    ("elastic", "elastic", 10),
    ("split 10P", "split", 10),
    ("split P", "split", 1),
]


def run_one(bench, tmp, strategy, p, k, slices, seed, extra, segments=None):
    out = os.path.join(tmp, "run.json")
    cmd = [bench, "--strategy", strategy, "--processes", str(p), "--slowdown", str(k),
           "--slices", str(slices), "--seed", str(seed), "--json", out] + extra
    if segments:
        cmd += ["--segments", segments]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit("failed: %s\n%s%s" % (" ".join(cmd), res.stdout, res.stderr))
    with open(out) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default=os.path.join(ROOT, "build/bin/straggler_bench"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--key-reps", type=int, default=5, help="repetitions of P=8, k=4")
    ap.add_argument("--processes", default="4,8")
    ap.add_argument("--slowdowns", default="1,2,4,8")
    ap.add_argument("--csv", default=os.path.join(ROOT, "docs/straggler_results.csv"))
    ap.add_argument("--img", default=os.path.join(ROOT, "docs/img"))
    ap.add_argument("extra", nargs="*", help="more straggler_bench flags (after --)")
    args = ap.parse_args()
    ps = [int(x) for x in args.processes.split(",")]
    ks = [float(x) for x in args.slowdowns.split(",")]
    rows = []
    gantt = {}
    tmp = tempfile.mkdtemp(prefix="straggler.")
    for p in ps:
        for k in ks:
            reps = args.key_reps if (p == 8 and k == 4) else args.reps
            for rep in range(reps):
                for label, strategy, per in CONFIGS:
                    seg = None
                    if p == 8 and k == 4 and rep == 0:
                        seg = os.path.join(tmp, "seg-%s.csv" % strategy + label.replace(" ", ""))
                    r = run_one(args.bench, tmp, strategy, p, k, per * p, rep + 1, args.extra, seg)
                    if seg:
                        gantt[label] = (seg, r)
                    row = {"label": label, "strategy": strategy, "processes": p, "slowdown": k,
                           "slices": per * p, "rep": rep, "makespan_s": r["makespan_s"],
                           "ideal_s": r["ideal_s"], "ratio": r["ratio"],
                           "idle_fast_mean_s": r["idle_fast_mean_s"],
                           "idle_fast_max_s": r["idle_fast_max_s"], "splits": r["splits"],
                           "exactly_once": r["exactly_once"]}
                    rows.append(row)
                    print("P=%d k=%g rep=%d %-9s makespan %.3f s  ratio %.3f  idle(fast) %.3f s  splits %d%s"
                          % (p, k, rep, label, r["makespan_s"], r["ratio"], r["idle_fast_mean_s"],
                             r["splits"], "" if r["exactly_once"] else "  EXACTLY-ONCE FAILED"),
                          flush=True)
    os.makedirs(os.path.dirname(args.csv), exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)

    # Medians.
    med = {}
    print("\n| P | k | strategy | slices | runs | makespan (s) | ideal (s) | makespan/ideal | idle of fast procs at end, mean (s) | splits |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for p in ps:
        for k in ks:
            for label, strategy, per in CONFIGS:
                sel = [r for r in rows if r["processes"] == p and r["slowdown"] == k and r["label"] == label]
                m = {key: statistics.median(r[key] for r in sel)
                     for key in ("makespan_s", "ideal_s", "ratio", "idle_fast_mean_s", "splits")}
                med[(p, k, label)] = m
                ratios = sorted(r["ratio"] for r in sel)
                print("| %d | %g | %s | %d | %d | %.3f | %.3f | **%.3f** (%.3f-%.3f) | %.3f | %g |"
                      % (p, k, label, per * p, len(sel), m["makespan_s"], m["ideal_s"], m["ratio"],
                         ratios[0], ratios[-1], m["idle_fast_mean_s"], m["splits"]))
    print("exactly once in every run:", all(r["exactly_once"] for r in rows))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(args.img, exist_ok=True)
    fig, axes = plt.subplots(1, len(ps), figsize=(5.5 * len(ps), 4), sharey=True)
    if len(ps) == 1:
        axes = [axes]
    for ax, p in zip(axes, ps):
        for label, strategy, per in CONFIGS:
            ax.plot(ks, [med[(p, k, label)]["ratio"] for k in ks], marker="o", label=label)
        ax.axhline(1.0, color="gray", lw=0.8, ls=":")
        ax.set_title("P = %d processes, one k-times slower" % p)
        ax.set_xlabel("slowdown k")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks)
        ax.set_xticklabels(["%g" % k for k in ks])
        ax.set_yscale("log", base=2)
        ticks = [1, 1.1, 1.25, 1.5, 2, 3, 4, 6, 8]
        ax.set_yticks(ticks)
        ax.set_yticklabels(["%g" % t for t in ticks])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("epoch makespan / ideal (median)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.img, "straggler_makespan.png"), dpi=110)

    labels = [c[0] for c in CONFIGS if c[0] in gantt]
    fig, axes = plt.subplots(len(labels), 1, figsize=(10, 2.1 * len(labels)), sharex=True)
    cmap = plt.get_cmap("tab20")
    for ax, label in zip(axes, labels):
        seg_path, r = gantt[label]
        with open(seg_path) as f:
            segs = list(csv.DictReader(f))
        for s in segs:
            rank = int(s["rank"])
            t0, t1 = float(s["t0_s"]), float(s["t1_s"])
            piece = s["piece"] == "1"
            ax.barh(rank, t1 - t0, left=t0, height=0.8, color=cmap(int(s["item"]) % 20),
                    edgecolor="black", lw=0.3, hatch="////" if piece else None)
        ax.axvline(r["ideal_s"], color="red", lw=1, ls="--")
        ax.set_yticks(range(r["processes"]))
        ax.set_yticklabels(["%d%s" % (i, " slow" if i >= r["processes"] - r["slow"] else "")
                            for i in range(r["processes"])], fontsize=7)
        ax.set_title("%s: makespan %.2f s = %.2f x ideal, %d splits (hatched: pieces split off a slow item)"
                     % (label, r["makespan_s"], r["ratio"], r["splits"]), fontsize=9)
    axes[-1].set_xlabel("seconds since the common start (red dashed: ideal)")
    fig.tight_layout()
    fig.savefig(os.path.join(args.img, "straggler_gantt.png"), dpi=110)
    print("wrote", args.csv, os.path.join(args.img, "straggler_makespan.png"),
          os.path.join(args.img, "straggler_gantt.png"))


if __name__ == "__main__":
    main()
