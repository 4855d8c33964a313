"""A map-style dataset under synchronous DDP: DistributedSampler + DataLoader per rank against
one PooledLoader(dataset) per host.

    PYTHONPATH=build/python python3 bench/pool/map_style_ddp.py --out /tmp/map_style_ddp

The script makes a folder of JPEGs (--images, sizes 32-256 px, quality 40-95, --classes
labels from the folder names, as torchvision's ImageFolder reads them) once, then runs
torchrun jobs of --ranks ranks (gloo, CPU), each training a tiny model for --epochs epochs
on ImageFolder(folder) (resized to 32x32) with:
  per_rank  DataLoader(dataset, batch_size, sampler=DistributedSampler(dataset, shuffle=True,
            seed=0), num_workers=--workers-per-rank, persistent_workers=True) on every rank
  pooled    PooledLoader(dataset, batch_size, loaders_per_host=--workers-per-rank x ranks,
            shuffle=True, seed=0): the one-line change
Each sample costs its JPEG decode plus a sleep of --sample-ms (augmentation standing in as a
sleep, so that on a small machine the loaders do not compete with the trainers for cores).
Cases:
  a  balanced
  b  a noisy neighbour: per_rank, the last rank's workers take --slow-factor x the sleep;
     pooled, the same number of the pool's loaders do (the same total loading capacity).
Targets: (b) pooled >= 1.5x faster per epoch; (a) not slower; shuffle quality (the share of
samples whose index neighbour i + 1 is in the same batch) within 2x of DistributedSampler's;
every sample once per epoch and every label with its sample (checked in every run).
Each case and mode runs --repeats times, the order of the modes alternated; the table gives
the median and range over repeats of the epoch time (the slowest rank's), epoch 0 included
(the loaders start in it) and epoch 1 alone.
"""

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time

CASES = {"a": "balanced", "b": "noisy neighbour"}
MODES = ("per_rank", "pooled")


def make_images(root, count, classes, seed=0):
    from PIL import Image
    if os.path.exists(os.path.join(root, "done")):
        return
    rng = random.Random(seed)
    for i in range(count):
        label = i % classes
        folder = os.path.join(root, f"class{label:02d}")
        os.makedirs(folder, exist_ok=True)
        w, h = rng.randint(32, 256), rng.randint(32, 256)
        colour = (25 * label % 256, 255 - 25 * label % 256, rng.randint(0, 255))
        Image.new("RGB", (w, h), colour).save(os.path.join(folder, f"{i:05d}.jpg"),
                                              quality=rng.randint(40, 95))
    open(os.path.join(root, "done"), "w").close()


class Costly:
    """ImageFolder sample i as (image, label, i), after a sleep of the sample's cost. The
    slow processes: per_rank, the DataLoader workers of rank `slow_rank`; pooled, the first
    `slow_loaders` loader processes to load a sample (a ticket from a shared counter)."""

    def __init__(self, root, sample_s, slow_factor, slow_rank, slow_loaders):
        import multiprocessing

        from torchvision import datasets, transforms
        self.images = datasets.ImageFolder(root, transform=transforms.Compose(
            [transforms.Resize((32, 32)), transforms.ToTensor()]))
        self.sample_s, self.slow_factor = sample_s, slow_factor
        self.slow_rank, self.slow_loaders = slow_rank, slow_loaders
        self.tickets = multiprocessing.Value("i", 0) if slow_loaders else None
        self._slow = None

    def __len__(self):
        return len(self.images)

    def _is_slow(self):
        if self._slow is None:
            if self.tickets is not None:
                with self.tickets.get_lock():
                    self._slow = self.tickets.value < self.slow_loaders
                    self.tickets.value += 1
            else:
                self._slow = int(os.environ.get("RANK", 0)) == self.slow_rank
        return self._slow

    def __getitem__(self, i):
        image, label = self.images[i]
        time.sleep(self.sample_s * (self.slow_factor if self._is_slow() else 1))
        return image, label, i


def neighbours(ids):
    s = sorted(ids)
    return sum(1 for a, b in zip(s, s[1:]) if b == a + 1)


def rank_main(args):
    import datetime

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    import tailcut.torch
    import tailcut.pool

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    slow = args.case == "b"
    ds = Costly(args.folder, args.sample_ms / 1e3, args.slow_factor if slow else 1,
                world - 1 if slow and args.mode == "per_rank" else -1,
                args.workers_per_rank if slow and args.mode == "pooled" else 0)
    if args.mode == "per_rank":
        sampler = DistributedSampler(ds, shuffle=True, seed=0)
        loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler,
                            num_workers=args.workers_per_rank, persistent_workers=True)
    else:
        sampler = None
        loader = tailcut.pool.PooledLoader(ds, batch_size=args.batch_size,
                                            loaders_per_host=args.workers_per_rank * world,
                                            shuffle=True, seed=0, num_epochs=args.epochs,
                                            name=args.job)
    model = DistributedDataParallel(torch.nn.Linear(3 * 32 * 32, args.classes))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    labels = ds.images.targets
    epochs = []
    for epoch in range(args.epochs):
        (sampler or loader).set_epoch(epoch)
        dist.barrier()
        start = time.monotonic()
        ids, wrong, together, steps = [], 0, 0, 0
        for images, targets, idx in loader:
            wrong += sum(int(t) != labels[int(i)] for t, i in zip(targets, idx))
            ids += idx.tolist()
            together += neighbours(idx.tolist())
            loss = torch.nn.functional.cross_entropy(model(images.reshape(len(images), -1)),
                                                     targets)
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
        seconds = time.monotonic() - start
        out = [None] * world
        dist.all_gather_object(out, dict(ids=ids, wrong=wrong, together=together, steps=steps,
                                         seconds=seconds))
        if rank == 0:
            all_ids = [i for o in out for i in o["ids"]]
            counts = {}
            for i in all_ids:
                counts[i] = counts.get(i, 0) + 1
            # DistributedSampler pads the epoch to a multiple of the ranks (repeats some);
            # the pool uses each once, and may carry a leftover into the next epoch.
            epochs.append(dict(
                epoch=epoch, seconds=max(o["seconds"] for o in out),
                steps=[o["steps"] for o in out], samples=len(all_ids),
                distinct=len(counts), repeated=sum(c - 1 for c in counts.values()),
                wrong_labels=sum(o["wrong"] for o in out),
                neighbour_share=sum(o["together"] for o in out) / max(len(all_ids), 1)))
    if args.mode == "pooled":
        if rank == 0:
            epochs[-1]["leftover_records"] = sum(r["leftover_records"] for r in loader.reports)
        loader.close()
    if rank == 0:
        with open(args.result, "w") as f:
            json.dump(epochs, f)
    dist.barrier()
    # Not destroy_process_group(), nor the interpreter's teardown: torch 1.13's gloo group can
    # deadlock in its destructor (a gloo thread frees a tensor and waits for the GIL while the
    # main thread, holding it, joins that thread); one rank of 20 runs hung so.
    sys.stdout.flush()
    os._exit(0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args, case, mode, repeat):
    result = os.path.join(args.out, f"{case}-{mode}-{repeat}.json")
    if args.resume and os.path.exists(result):  # a run an interrupted command finished
        with open(result) as f:
            return json.load(f)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
           "--nproc_per_node", str(args.ranks), "--rdzv_backend", "c10d", "--rdzv_endpoint",
           f"localhost:{free_port()}", "--redirects", "1", "--tee", "2", __file__, "--rank-main",
           "--case", case, "--mode", mode, "--result", result,
           "--job", f"map-bench-{os.getpid()}-{case}-{mode}-{repeat}"]
    for key in ("folder", "epochs", "batch_size", "workers_per_rank", "sample_ms",
                "slow_factor", "classes"):
        cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{case} {mode} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    with open(result) as f:
        return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="/tmp/map_style_ddp")
    parser.add_argument("--folder", default=None, help="default: OUT/images")
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers-per-rank", type=int, default=2)
    parser.add_argument("--sample-ms", type=float, default=2.0)
    parser.add_argument("--slow-factor", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cases", default="ab")
    parser.add_argument("--resume", action="store_true",
                        help="keep the runs whose results are in OUT already")
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_main:
        return rank_main(args)
    os.makedirs(args.out, exist_ok=True)
    args.folder = args.folder or os.path.join(args.out, "images")
    make_images(args.folder, args.images, args.classes)
    runs = {}
    for repeat in range(args.repeats):
        for case in args.cases:
            for mode in (MODES if repeat % 2 == 0 else MODES[::-1]):
                epochs = run(args, case, mode, repeat)
                runs.setdefault((case, mode), []).append(epochs)
                e = epochs[-1]
                times = " ".join("%.2f" % x["seconds"] for x in epochs)
                print(f"repeat {repeat} case {case} {mode:8s}: epochs {times} s, "
                      f"steps {e['steps']}, "
                      f"distinct {e['distinct']}, repeated {e['repeated']}, wrong labels "
                      f"{sum(x['wrong_labels'] for x in epochs)}, neighbours "
                      f"{100 * statistics.mean(x['neighbour_share'] for x in epochs):.3f} %",
                      flush=True)
    summary = {}
    for case in args.cases:
        for mode in MODES:
            reps = runs[(case, mode)]
            total = [sum(x["seconds"] for x in r) for r in reps]
            second = [r[-1]["seconds"] for r in reps]
            share = [statistics.mean(x["neighbour_share"] for x in r) for r in reps]
            summary[f"{case}/{mode}"] = dict(
                total_median=statistics.median(total), total_range=(min(total), max(total)),
                epoch1_median=statistics.median(second), epoch1_range=(min(second), max(second)),
                neighbour_share=statistics.median(share))
        ratios = [sum(x["seconds"] for x in p) / sum(x["seconds"] for x in q)
                  for p, q in zip(runs[(case, "per_rank")], runs[(case, "pooled")])]
        summary[f"{case}/ratio"] = dict(median=statistics.median(ratios),
                                        range=(min(ratios), max(ratios)))
    print(f"\n| case | mode | {args.epochs} epochs, median (range) | epoch 1, median (range) | "
          f"index neighbours in a batch |")
    print("|---|---|---|---|---|")
    for case in args.cases:
        for mode in MODES:
            s = summary[f"{case}/{mode}"]
            print(f"| {case} ({CASES[case]}) | {mode} | {s['total_median']:.2f} s "
                  f"({s['total_range'][0]:.2f}-{s['total_range'][1]:.2f}) | "
                  f"{s['epoch1_median']:.2f} s ({s['epoch1_range'][0]:.2f}-"
                  f"{s['epoch1_range'][1]:.2f}) | {100 * s['neighbour_share']:.3f} % |")
        r = summary[f"{case}/ratio"]
        print(f"| {case} | per_rank / pooled | {r['median']:.2f} ({r['range'][0]:.2f}-"
              f"{r['range'][1]:.2f}) | | |")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(dict(args=vars(args), summary=summary,
                       runs={f"{c}/{m}": v for (c, m), v in runs.items()}), f, indent=1)


if __name__ == "__main__":
    main()
