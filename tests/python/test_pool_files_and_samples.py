"""What another local user, a huge dataset, an odd sample or a full /dev/shm can do to a
pool, each met as a user meets it (a job in processes of its own):

* files planted at the names of the pool's files in /dev/shm (a FIFO, another user's file
  anyone may write, a symbolic link) neither block the job nor receive what it writes; one
  at a name the job reads or replaces is refused naming the path and the fix;
* a length whose item table no process could hold is refused up front with the limit and
  the fix; the largest that works opens at once;
* any sample torch's default_collate accepts reaches the rank as a DataLoader gives it;
  what cannot be carried names the samples and the field;
* a /dev/shm too full for the pool's description is a NoSpaceError naming the file and
  the free space, and leaves nothing behind."""

import os
import pathlib
import socket
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch", reason="tailcut.torch needs PyTorch (python3-torch)")

HERE = pathlib.Path(__file__).resolve().parent
NOBODY = 65534


def run_job(code, timeout=90, wrap=None):
    """Runs `code` (Python, after `import tailcut, torch, tailcut.pool, tailcut.torch as tt`) in a process
    of its own; returns its stdout, or fails naming a hang."""
    script = ("import os, sys, tailcut, torch\nimport tailcut.pool\nimport tailcut.torch as tt\n"
              + textwrap.dedent(code))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]))
    env.pop("LOCAL_WORLD_SIZE", None)
    argv = [sys.executable, "-c", script]
    try:
        done = subprocess.run((wrap or []) + argv, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the job did not end within {timeout} s (blocked?):\n{e.stderr}")
    assert done.returncode == 0, done.stderr
    return done.stdout


# One rank, its own loaders; `plant` runs in the job's process before the pool starts (the
# pool's temporary names held the writer's pid).
JOB = """
    from _map_datasets import Labelled
    ring = {ring!r}
    base = f"/dev/shm/tailcut-pool.{{os.geteuid()}}.{{ring}}"
    {plant}
    loader = tailcut.pool.PooledLoader(Labelled(64), batch_size=8, loaders_per_host=1, rank=0, world_size=1,
                             local_rank=0, timeout=30, name={queue!r},
                             num_epochs=1, slot_bytes=1 << 14, num_slots=4)
    try:
        print("samples", sum(len(b[1]) for b in loader))
    except tailcut.Error as e:
        print("error", type(e).__name__, e)
    finally:
        loader.close()
"""


def plant(path, kind):
    """Python that plants `kind` at `path` as another user (uid 65534) would."""
    made = {"fifo": f"os.mkfifo({path}, 0o666)",
            "file": f"open({path}, 'w').write('planted'); os.chmod({path}, 0o666)",
            "symlink": f"os.symlink('/dev/shm/planted-target-{os.getpid()}', {path})"}[kind]
    return f"{made}; os.lchown({path}, {NOBODY}, {NOBODY})"


def planted_intact(path, kind):
    st = os.lstat(path)
    assert st.st_uid == NOBODY, path
    if kind == "file":
        assert pathlib.Path(path).read_text() == "planted" and st.st_mode & 0o777 == 0o666


@pytest.fixture
def ring(qname):
    name = qname + ".pool"  # the pool's ring is named after its queue
    yield name
    import glob
    for path in glob.glob(f"/dev/shm/tailcut-pool.{os.geteuid()}.{name}.*"):
        os.unlink(path)
    for path in glob.glob(f"/dev/shm/planted-target-{os.getpid()}"):
        os.unlink(path)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's file "
                                "needs root (chown)")


@needs_root
@pytest.mark.parametrize("kind", ["fifo", "file", "symlink"])
def test_files_planted_at_the_temporary_names_neither_block_nor_receive_the_job(ring, qname,
                                                                                 kind):
    # The description's and the failure record's temporary names as they were (the
    # writer's pid): a FIFO there blocked open() forever; a 0666 file of another user got
    # the description (sys.path, pickled callables) and was renamed into place.
    where = ["f'{base}.json.{os.getpid()}.tmp'", "f'{base}.error.{os.getpid()}.tmp'"]
    code = JOB.format(ring=ring, queue=qname, plant="; ".join(plant(w, kind) for w in where))
    out = run_job(code)
    assert out.split() == ["samples", "64"], out
    base = f"/dev/shm/tailcut-pool.{os.geteuid()}.{ring}"
    for name in (f"{base}.json", f"{base}.error"):
        leftovers = [p for p in os.listdir("/dev/shm") if p.startswith(os.path.basename(name))]
        assert all(os.lstat("/dev/shm/" + p).st_uid == NOBODY for p in leftovers), leftovers
        for p in leftovers:  # the planted ones, as they were: nothing written into them
            planted_intact("/dev/shm/" + p, kind)
    assert not os.path.exists(base + ".json")  # the job's own description is gone


@needs_root
@pytest.mark.parametrize("kind", ["fifo", "file", "symlink"])
@pytest.mark.parametrize("suffix, what", [(".json", "pool description"),
                                          (".error", "loader failure record")])
def test_a_file_planted_at_a_final_name_is_refused_naming_the_path_and_the_fix(
        ring, qname, kind, suffix, what):
    path = f"/dev/shm/tailcut-pool.{os.geteuid()}.{ring}{suffix}"
    code = JOB.format(ring=ring, queue=qname, plant=plant(repr(path), kind))
    out = run_job(code)
    assert out.startswith("error PermissionDeniedError " + f"{what} {path}: "), out
    assert "refusing to use it" in out and f"rm -f {path}" in out, out
    planted_intact(path, kind)


# Map-style datasets whose length no table can hold, and the largest one that works.
HUGE = """
    class Huge:
        def __init__(self, n):
            self.n = n
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            return torch.tensor([i])
    import resource, time
    t = time.monotonic()
    try:
        ds = tt.IndexDataset(Huge({n}), name={queue!r}, num_epochs=1, shuffle=False{extra})
        print("sample", next(iter(ds)).item())
        ds.close()
    except tailcut.InvalidArgumentError as e:
        print("refused", e)
    print("seconds", time.monotonic() - t)
    print("rss_mib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10)
"""


def test_a_length_whose_item_table_no_process_can_hold_is_refused_up_front(qname):
    # 2**40 samples, 256 an item: 4G items, 300 GiB of tables; a rank grew to 2.8 GiB and
    # gave no answer in a minute. Refused before any table is built.
    out = run_job(HUGE.format(n=2 ** 40, queue=qname, extra=""), timeout=60)
    assert (f"queue '{qname}': num_samples=1099511627776 makes 4294967296 items of 256 "
            f"samples; the limit is 4194304 items (each takes memory and /dev/shm): pass "
            f"num_slices=4194304 or fewer (items of 262144 samples or more)") in out, out
    lines = dict(line.split(" ", 1) for line in out.splitlines())
    assert float(lines["seconds"]) < 10 and int(lines["rss_mib"]) < 500, out


def test_the_largest_length_at_256_samples_an_item_and_a_huge_one_in_larger_items_work(qname):
    for n, extra in ((2 ** 30, ""), (2 ** 40, ", num_slices=2**22")):
        out = run_job(HUGE.format(n=n, queue=qname, extra=extra), timeout=120)
        lines = dict(line.split(" ", 1) for line in out.splitlines())
        assert lines.get("sample") == "0", out
        assert float(lines["seconds"]) < 30 and int(lines["rss_mib"]) < 1024, out
        if not extra:  # one sample more is an item too many
            beyond = HUGE.format(n=n + 1, queue=qname, extra=extra)
            assert "the limit is 4194304 items" in run_job(beyond), n


HUGE_JOB = """
import os, resource, sys, time
import torch.distributed as dist
import tailcut, tailcut.pool, tailcut.torch as tt

class Huge:
    def __len__(self):
        return 2 ** 40
    def __getitem__(self, i):
        return i

dist.init_process_group("gloo")
t = time.monotonic()
loader = None
try:  # the queue is opened by the constructor or the first iteration
    loader = tailcut.pool.PooledLoader(Huge(), batch_size=8, num_workers=1, name=sys.argv[2])
    said = f"accepted {next(iter(loader))}"
except tailcut.InvalidArgumentError as e:
    said = f"refused {e}"
finally:
    if loader is not None:
        loader.close()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}"), "w") as f:
    f.write(f"{time.monotonic() - t:.2f} {rss} {said}")
"""


def test_a_torchrun_job_over_a_length_no_table_can_hold_is_refused_on_every_rank(tmp_path,
                                                                                  qname):
    # The job as it was met: a rank of such a job grew to 2.8 GiB in 60 s with no answer.
    (tmp_path / "job.py").write_text(HUGE_JOB)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--rdzv_backend=c10d",
           f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id={qname}", "--nproc_per_node=2",
           "--redirects", "1", "--tee", "2", str(tmp_path / "job.py"), str(tmp_path), qname]
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert time.monotonic() - started < 60, proc.stdout[-6000:]
    for rank in (0, 1):
        seconds, rss_mib, said = (tmp_path / f"rank{rank}").read_text().split(" ", 2)
        assert said.startswith("refused ") and (
            f"queue '{qname}': num_samples=1099511627776 makes 4294967296 items of 256 samples; "
            f"the limit is 4194304 items (each takes memory and /dev/shm): pass "
            f"num_slices=4194304 or fewer (items of 262144 samples or more)") in said, said
        assert float(seconds) < 10 and int(rss_mib) < 1024, (seconds, rss_mib)
    assert not [f for f in os.listdir("/dev/shm") if qname in f]


# Samples of every kind torch's default_collate takes.
SAMPLES = """
    import collections
    Point = collections.namedtuple("Point", "x y")
    globals()["Point"] = Point

    class Everything:
        def __len__(self):
            return 24
        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            d = {{f"t{{k}}": torch.rand(2, generator=g) * k for k in range(12)}}
            d["bf16"] = torch.rand(3, generator=g).to(torch.bfloat16)
            d["half"] = torch.rand(2, generator=g).half()
            d["c64"] = torch.rand(2, generator=g).to(torch.complex64) * 1j
            d["c128"] = torch.rand(2, generator=g).double().to(torch.complex128)
            d["video"] = torch.rand(1, 2, 1, 2, generator=g)  # 5 dims once collated
            d["ints"] = [torch.tensor(i, dtype=dt) for dt in (torch.int8, torch.int16,
                         torch.int32, torch.uint8, torch.bool)]
            d["nested"] = {{"deep": ({{"id": i, "w": i * 0.5, "ok": i % 2 == 0}}, f"name{{i}}")}}
            d["point"] = Point(torch.tensor([i]), i)
            d["raw"] = bytes([i, 255])
            d["np"] = __import__("numpy").full((2,), i, dtype="float32")
            d["ordered"] = collections.OrderedDict(b=torch.tensor([i]), a=i * 2)
            return d

    from torch.utils.data import default_collate
    ds = Everything()
    loader = tailcut.pool.PooledLoader(ds, batch_size=6, loaders_per_host=2, rank=0, world_size=1,
                             local_rank=0, timeout=30, name={queue!r},
                             num_epochs=1, shuffle=False, slot_bytes=1 << 16, num_slots=4)

    def same(a, b, path):
        assert type(a) is type(b), (path, type(a), type(b))
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), path
        elif isinstance(a, dict):
            assert list(a) == list(b), path
            for k in a:
                same(a[k], b[k], f"{{path}}[{{k!r}}]")
        elif isinstance(a, (list, tuple)):
            assert len(a) == len(b), path
            for i, (u, v) in enumerate(zip(a, b)):
                same(u, v, f"{{path}}[{{i}}]")
        else:
            assert a == b, path

    try:
        seen = []
        for batch in loader:
            # The samples of the batch, in order: the two loaders may split the item.
            ids = batch["nested"]["deep"][0]["id"].tolist()
            same(batch, default_collate([ds[i] for i in ids]), "batch")
            assert isinstance(batch["point"], Point)
            assert isinstance(batch["ordered"], collections.OrderedDict)
            seen += ids
        print("samples", len(seen), sorted(seen) == list(range(24)))
    finally:
        loader.close()
"""


def test_any_sample_default_collate_takes_reaches_the_rank_as_a_dataloader_gives_it(ring,
                                                                                    qname):
    # A dict of 12 tensors had 13 arrays, more than the 256-byte slot header held; bfloat16
    # failed with torch's bare "Got unsupported ScalarType BFloat16".
    out = run_job(SAMPLES.format(ring=ring, queue=qname))
    assert out.split() == ["samples", "24", "True"], out


UNCARRIED = """
    class Quantized:
        def __len__(self):
            return 16
        def __getitem__(self, i):
            x = torch.quantize_per_tensor(torch.rand(2), 0.1, 0, torch.quint8)
            return {{"q": x, "label": i}}

    loader = tailcut.pool.PooledLoader(Quantized(), batch_size=4, loaders_per_host=1, rank=0, world_size=1,
                             local_rank=0, timeout=30, name={queue!r},
                             num_epochs=1, shuffle=False, slot_bytes=1 << 14, num_slots=4)
    try:
        next(iter(loader))
    except TypeError as e:
        print("refused", e, *getattr(e, "__notes__", ()))
    finally:
        loader.close()
"""


TOO_LARGE = """
    class Large:
        def __len__(self):
            return 16
        def __getitem__(self, i):
            return {{"small": torch.zeros(4), "image": torch.zeros(1024)}}

    loader = tailcut.pool.PooledLoader(Large(), batch_size=4, num_workers=1, rank=0, world_size=1,
                             local_rank=0, timeout=30, name={queue!r},
                             num_epochs=1, shuffle=False, slot_bytes=1 << 12, num_slots=4)
    try:
        for batch in loader:
            pass
    except (ValueError, RuntimeError) as e:
        print("refused", e)
    finally:
        loader.close()
"""


def test_a_sample_the_ring_cannot_carry_is_refused_naming_the_samples_and_the_field(ring,
                                                                                   qname):
    out = run_job(UNCARRIED.format(ring=ring, queue=qname))
    assert out.startswith("refused batch['q'] is a quantized tensor (torch.quint8), which a "
                          "pooled batch cannot carry: dequantize it in collate_fn or transform"), out
    assert "in the batch of dataset[0] .. dataset[3] (4 samples)" in out, out
    # Samples that collate into a batch larger than a slot: the field and the samples are
    # named (it said "a batch of N bytes does not fit a slot").
    out = run_job(TOO_LARGE.format(ring=ring, queue=qname))
    assert "does not fit a slot of 4096 bytes at field batch['image'] of the batch of " \
        "dataset[0] .. dataset[3] (4 samples) (dtype float32, shape (4, 1024)): pass a larger " \
        "slot_bytes" in out, out


FULL = """
    import glob
    from _map_datasets import Labelled
    from tailcut.pool import _description

    def fill():  # as another job's files would, once the ring and queue are made
        fd = os.open("/dev/shm/filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"x" * 4096)
        except OSError:
            os.close(fd)

    write = _description.write
    _description.write = lambda *args: (fill(), write(*args))[1]
    loader = tailcut.pool.PooledLoader(Labelled(64), batch_size=8, num_workers=1, rank=0, world_size=1,
                             local_rank=0, timeout=30, name="full",
                             num_epochs=1, slot_bytes=1 << 14, num_slots=4)
    try:
        next(iter(loader))
    except tailcut.NoSpaceError as e:
        print("nospace", e)
    os.unlink("/dev/shm/filler")
    loader.close()
    print("left", sorted(os.path.basename(p) for p in glob.glob("/dev/shm/*")))
"""


def test_a_full_dev_shm_at_the_description_is_no_space_naming_the_file_and_leaves_nothing():
    # The job in a mount namespace of its own whose /dev/shm is a 4 MiB tmpfs.
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace here (unshare: {probe.stderr.decode().strip()})")
    wrap = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount -t tmpfs -o size=4m,mode=1777 tmpfs /dev/shm && exec "$@"', "sh"]
    out = run_job(FULL, wrap=wrap)
    path = f"/dev/shm/tailcut-pool.{os.geteuid()}.full.pool.json"
    assert f"nospace cannot write " in out and f" of pool description {path}: No space left on " \
        f"device (/dev/shm has " in out, out
    assert " free); free space in /dev/shm (`tailcut clean` removes what stopped jobs left " \
        "there)" in out, out
    assert out.splitlines()[-1] == "left []", out
