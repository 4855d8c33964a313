"""Stress for PooledLoader checkpoints: each round runs the torchrun job of
test_pooled_checkpoint.py (2 ranks, 3 epochs of 2400 records, a checkpoint
every --every steps chosen at random per round, and at each epoch end),
SIGKILLs it at a random moment up to 0.5 s after a checkpoint, resumes it from the last
checkpoint, kills that run too (up to --kills times per round), and lets the
last run finish; then checks that every record of every epoch was trained
exactly once apart from the reported leftovers, with equal steps, and that
nothing is left in /dev/shm.

    PYTHONPATH=build/python python3 tests/python/pooled_ckpt_stress.py --rounds 10
"""

import argparse
import os
import pathlib
import random
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import test_pooled_checkpoint as t  # noqa: E402


def one_round(rng, kills, workdir):
    name = f"ckpt-stress-{os.getpid()}-{rng.randrange(1 << 30)}"
    out = workdir / name
    out.mkdir()
    data = t.write_ids(workdir / f"{name}.bin", t.RECORDS)
    every = str(rng.choice([0, 7, 13, 25, 40]))
    cuts, resume = {}, []
    try:
        for _ in range(kills):
            run, cut = t.run_killed(data, out, name, rng.uniform(0, 0.5), "--every", every,
                                    *resume)
            cuts[run] = cut
            resume = ["--resume", str(out / "ckpt.pt")]
            if cut[0] >= t.EPOCHS:
                break
        t.finish(t.start(data, out, name, "--every", every, *resume))
        t.check(out, cuts)
        left = t.leftovers(name)
        assert not left, left
        return cuts
    finally:
        t.remove_dead_run(name)
        try:
            t.tailcut.remove_queue(name, force=True)
        except t.tailcut.NotFoundError:
            pass


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--kills", type=int, default=2, help="kills per round (1 or more)")
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"seed {seed}", flush=True)
    failed = resumed = 0
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.rounds):
            start = time.monotonic()
            try:
                cuts = one_round(rng, max(args.kills, 1), pathlib.Path(d))
                # A kill after the last epoch's checkpoint leaves nothing to resume.
                resumed += sum(epoch < t.EPOCHS for epoch, _ in cuts.values())
                print(f"round {i}: ok, resumed from {sorted(cuts.values())} "
                      f"({time.monotonic() - start:.1f} s)", flush=True)
            except AssertionError as e:
                failed += 1
                print(f"round {i}: FAILED: {e}", flush=True)
    print(f"{args.rounds - failed} of {args.rounds} rounds passed; {resumed} resumes from a "
          f"checkpoint before the job's end")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
