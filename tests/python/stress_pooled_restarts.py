"""Repeats the PooledLoader lifecycle cases of test_pooled_lifecycle.py (real torchrun jobs)
at random kill moments and prints one summary line per case and one in all.

    PYTHONPATH=build/python:tests/python \
        python3 tests/python/stress_pooled_restarts.py [ROUNDS] [--seconds S] [CASE...]

ROUNDS (default 10) rounds, each running every case given (default: all) once, so that a
run cut short has run every case about as often. --seconds: start no round after S
seconds. A failed round prints its error (with the line that failed) and the case's
output; the exit status is 1 if any round failed.
"""

import contextlib
import io
import pathlib
import re
import shutil
import sys
import tempfile
import time
import traceback

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import test_pooled_lifecycle as t  # noqa: E402

CASES = {
    "rank_killed": t.test_sigkill_of_one_rank_restarts_cleanly,
    "job_killed_rerun": t.test_sigkill_of_the_whole_job_then_rerun,
    "loaders_raise": t.test_loaders_that_raise_reach_every_rank,
    "raise_rank_ended":
        t.test_loaders_that_raise_leave_nothing_when_torchrun_ends_their_rank_first,
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
        # Where it failed too: a bare assert says nothing of itself. The test's own frames
        # (pytest.fail's are inside pytest), the innermost last: a wait_for and its caller.
        frames = traceback.extract_tb(e.__traceback__)
        ours = [f for f in frames if pathlib.Path(f.filename).resolve().parent == HERE]
        where = " < ".join(f"{pathlib.Path(f.filename).name}:{f.lineno}: {f.line}"
                           for f in reversed((ours or frames)[-2:]))
        return f"{type(e).__name__}: {str(e)[:400]} (at {where})", text.getvalue()
    finally:
        for job in t.Job.started:  # what a failed round left running
            for pid in job.processes():
                t.os.kill(pid, t.signal.SIGKILL)
        t.Job.started.clear()
        shutil.rmtree(root, ignore_errors=True)


def numbers(pattern, texts):
    return [float(x) for s in texts for x in re.findall(pattern, s)]


def summary(case, outputs, errors):
    line = f"{case}: {len(outputs) - len(errors)}/{len(outputs)} passed"
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
    return line


def main():
    args = sys.argv[1:]
    rounds = int(args.pop(0)) if args and args[0].isdigit() else 10
    seconds = float("inf")
    if "--seconds" in args:
        at = args.index("--seconds")
        seconds = float(args[at + 1])
        del args[at:at + 2]
    cases = args or list(CASES)
    outputs = {case: [] for case in cases}
    errors = {case: [] for case in cases}
    started = time.monotonic()
    done = 0
    for i in range(rounds):
        if time.monotonic() - started > seconds:
            break
        for case in cases:
            error, output = one_round(case)
            outputs[case].append(output)
            if error:
                errors[case].append(error)
                print(f"{case} round {i}: FAILED {error}\n{output}", flush=True)
        done += 1
        print(f"round {i}: {sum(map(len, errors.values()))} failed so far, "
              f"{time.monotonic() - started:.0f} s", flush=True)
    for case in cases:
        print(summary(case, outputs[case], errors[case]), flush=True)
    failed = sum(map(len, errors.values()))
    print(f"all: {len(cases) * done - failed}/{len(cases) * done} case runs passed in {done} "
          f"rounds, {time.monotonic() - started:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
