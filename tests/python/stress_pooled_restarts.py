"""Repeats the PooledLoader lifecycle cases of test_pooled_lifecycle.py (real torchrun jobs)
at random kill moments and prints one summary line per case and one in all.

    PYTHONPATH=build/python:tests/python \
        python3 tests/python/stress_pooled_restarts.py [ROUNDS] [CASE...]

ROUNDS (default 10) rounds of every case given (default: all). A failed round prints its
error and the case's output; the exit status is 1 if any round failed.
"""

import contextlib
import io
import pathlib
import re
import shutil
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import test_pooled_lifecycle as t  # noqa: E402

CASES = {
    "rank_killed": t.test_sigkill_of_one_rank_restarts_cleanly,
    "job_killed_rerun": t.test_sigkill_of_the_whole_job_then_rerun,
    "loaders_raise": t.test_loaders_that_raise_reach_every_rank,
    "loader_killed": t.test_the_only_loader_killed_reaches_every_rank,
    "no_close": t.test_clean_exit_without_close_leaves_nothing,
}


def data_dir(root):
    d = root / "data"
    d.mkdir()
    start = 0
    for i, n in enumerate([500, 400, 300]):
        t.write_records(d / f"part-{i}.bin", range(start, start + n))
        start += n
    return d


def one_round(case):
    root = pathlib.Path(tempfile.mkdtemp(prefix="tailcut-stress-"))
    out = root / "out"
    out.mkdir()
    text = io.StringIO()
    try:
        with contextlib.redirect_stdout(text):
            CASES[case](data_dir(root), out)
        return None, text.getvalue()
    except BaseException as e:  # pytest.fail raises a BaseException
        if isinstance(e, KeyboardInterrupt):
            raise
        return f"{type(e).__name__}: {str(e)[:400]}", text.getvalue()
    finally:
        for job in t.Job.started:  # what a failed round left running
            for pid in job.processes():
                t.os.kill(pid, t.signal.SIGKILL)
        t.Job.started.clear()
        shutil.rmtree(root, ignore_errors=True)


def numbers(pattern, texts):
    return [float(x) for s in texts for x in re.findall(pattern, s)]


def main():
    args = sys.argv[1:]
    rounds = int(args.pop(0)) if args and args[0].isdigit() else 10
    cases = args or list(CASES)
    failed = 0
    started = time.monotonic()
    for case in cases:
        outputs, errors = [], []
        for i in range(rounds):
            error, output = one_round(case)
            outputs.append(output)
            if error:
                errors.append(error)
                print(f"{case} round {i}: FAILED {error}\n{output}", flush=True)
        failed += len(errors)
        line = f"{case}: {rounds - len(errors)}/{rounds} passed"
        delays = numbers(r"(?:raised|stopped) ([0-9.]+) s after the fault", outputs)
        if delays:
            line += f"; ranks raised or stopped {min(delays):.2f}-{max(delays):.2f} s after it"
        gone = numbers(r"orphaned loaders gone ([0-9.]+) s", outputs)
        if gone:
            line += f"; orphaned loaders gone {min(gone):.2f}-{max(gone):.2f} s after the job"
        twice = numbers(r"; ([0-9]+) twice", outputs)
        lost = numbers(r", ([0-9]+) never", outputs)
        if twice:
            line += (f"; records twice {int(min(twice))}-{int(max(twice))}, lost "
                     f"{int(min(lost))}-{int(max(lost))} (per round)")
        print(line, flush=True)
    print(f"all: {len(cases) * rounds - failed}/{len(cases) * rounds} rounds passed in "
          f"{time.monotonic() - started:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
