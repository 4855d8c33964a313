"""tailcut.BatchRing's CUDA registration from Python (cuda_pinned, memory_state), in fresh
interpreters: against the stand-in CUDA runtime built for the C++ tests (its path in
TAILCUT_TEST_FAKE_CUDART), and on this host as it is. What is checked is what tailcut asks of
the runtime and what it says, not a real GPU's DMA."""

import os
import subprocess
import sys
import textwrap

import pytest

FAKE = os.environ.get("TAILCUT_TEST_FAKE_CUDART", "")
needs_fake = pytest.mark.skipif(not FAKE or not os.path.exists(FAKE),
                                reason="TAILCUT_TEST_FAKE_CUDART names no built stand-in runtime")

# Opens a loader and two trainers of one ring, prints what each says, removes the ring.
SCRIPT = textwrap.dedent("""
    import os, tailcut
    name = "pytest-ringcuda-%d" % os.getpid()
    try:
        loader = tailcut.BatchRing(name, 4000, 3, "loader")
        trainers = [tailcut.BatchRing(name, 4000, 3, "trainer") for _ in range(2)]
        off = tailcut.BatchRing(name, 4000, 3, "trainer", cuda_register=False)
        for ring in [loader] + trainers + [off]:
            print(ring.role, ring.cuda_pinned, ring.memory_state)
    finally:
        tailcut.remove_batch_ring(name)
""")


def run(**fake_env):
    env = dict(os.environ)
    env.update(fake_env)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines(), out.stderr


def fake(device_status="0", devices="1", register_status="0"):
    return dict(TAILCUT_CUDART=FAKE, FAKE_CUDART_DEVICE_STATUS=device_status,
                FAKE_CUDART_DEVICES=devices, FAKE_CUDART_REGISTER_STATUS=register_status)


@needs_fake
def test_trainers_are_cuda_pinned_and_loaders_are_not():
    lines, err = run(**fake())
    assert lines == [
        "loader False arena: 12 KiB (3 slots of 4 KiB)",
        "trainer True arena: 12 KiB (3 slots of 4 KiB) + CUDA-pinned",
        "trainer True arena: 12 KiB (3 slots of 4 KiB) + CUDA-pinned",
        "trainer False arena: 12 KiB (3 slots of 4 KiB)",
    ]
    assert err == ""


@needs_fake
def test_a_host_without_a_device_is_silent_and_says_why():
    lines, err = run(**fake(device_status="100", devices="0"))
    why = "not CUDA-pinned: no CUDA device (cudaGetDeviceCount: CUDA error 100 (fake error))"
    assert lines[1] == f"trainer False arena: 12 KiB (3 slots of 4 KiB); {why}"
    assert err == "", "no GPU here: nothing on stderr"


@needs_fake
def test_a_gpu_that_refuses_is_one_notice_on_stderr():
    lines, err = run(**fake(register_status="2"))
    assert lines[1].endswith("; not CUDA-pinned: cudaHostRegister failed: CUDA error 2 "
                             "(fake error)")
    notices = err.splitlines()
    assert len(notices) == 1, err
    assert "arena not CUDA-pinned: cudaHostRegister failed" in notices[0]


def test_this_host_says_whether_the_arena_is_pinned():
    env = {k: v for k, v in os.environ.items() if k != "TAILCUT_CUDART"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    trainer = out.stdout.splitlines()[1]
    pinned = trainer.split()[1] == "True"
    assert trainer.endswith("+ CUDA-pinned") if pinned else "; not CUDA-pinned: " in trainer
