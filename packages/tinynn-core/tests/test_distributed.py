"""Data-parallel training under mpiexec (the [mpi] extra's mpich), against one process on the same global
batch; resume; a failing rank; and what happens without mpi4py. The mpiexec runs use the backend under test
(with tinynn-gpu, two ranks share lavapipe). Without the extra these tests skip, unless TINYNN_REQUIRE_MPI=1
(set by nox) makes that a failure."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinynn import checkpoint, distributed
from tinynn.cli import main
from tinynn.config import from_dict
from tinynn.train import train

# bias=False: see test_accumulation.py (the key bias's zero gradient makes Adam amplify rounding noise)
CONFIG = {"data": "data.txt", "block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16, "bias": False,
          "batch_size": 8, "grad_accum_steps": 2, "max_steps": 20, "warmup_steps": 2, "eval_interval": 10,
          "eval_steps": 2, "checkpoint_interval": 10, "sample_tokens": 10}


@pytest.fixture
def mpiexec():
    found = shutil.which("mpiexec", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if found is None:
        if os.environ.get("TINYNN_REQUIRE_MPI") == "1":
            pytest.fail("TINYNN_REQUIRE_MPI=1 but there is no mpiexec (pip install 'tinynn-core[mpi]')")
        pytest.skip("no mpiexec: pip install 'tinynn-core[mpi]'")
    return found


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.txt").write_text("The quick brown fox jumps over the lazy dog. " * 40)
    return tmp_path


def launch(mpiexec, ranks, *args, timeout=120):
    """`mpiexec -n ranks tinynn ...` with this interpreter's tinynn; returns the finished process."""
    command = [mpiexec, "-n", str(ranks), sys.executable, "-m", "tinynn.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def write_config(path, **overrides):
    path.write_text(json.dumps({**CONFIG, **overrides}))
    return str(path)


def max_relative_difference(a: dict, b: dict) -> float:
    return max(float(np.abs(a[k] - b[k]).max() / np.abs(b[k]).max()) for k in b)


def test_two_ranks_equal_one_process_on_the_global_batch(mpiexec, workdir, backend):
    done = launch(mpiexec, 2, "train", "--config", write_config(workdir / "c.json", out_dir="dp"), "--quiet",
                  "--device", "gpu" if backend.is_gpu else "cpu")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("checkpoint: dp") == 1 and done.stdout.count("sample:") == 1  # rank 0 alone
    parallel = checkpoint.load(workdir / "dp" / "ckpt.safetensors")
    single = train(from_dict({**CONFIG, "grad_accum_steps": 1, "out_dir": "single"}), device=backend,
                   progress=False)
    assert parallel["step"] == 20
    assert max_relative_difference(parallel["model"], single.model.state_dict()) <= 1e-4
    np.testing.assert_allclose(parallel["history"]["train_loss"], single.history["train_loss"], rtol=1e-5)
    assert parallel["history"]["val_step"] == [10, 20]


@pytest.mark.parametrize("in_thread", [False, True])
def test_reduce_on_host_reduces_every_part_in_order(backend, in_thread):
    """The data-parallel round trip (pipelined on a GPU): read back, each part reduced in place, written."""
    values = np.random.default_rng(0).standard_normal(1001).astype(np.float32)
    src, dst = backend.from_numpy(values), backend.from_numpy(np.full(1001, np.nan, np.float32))
    host, order, ends = np.zeros(1001, np.float32), [], [0, 1, 400, 1001]

    def doubling(i, start, stop):
        def fn():
            order.append(i)
            host[start:stop] *= 2
        return fn
    parts = [(a, b, doubling(i, a, b)) for i, (a, b) in enumerate(zip(ends[:-1], ends[1:]))]
    backend.reduce_on_host_(src, dst, host, parts, in_thread=in_thread)
    np.testing.assert_array_equal(backend.to_numpy(dst), 2 * values)
    np.testing.assert_array_equal(host, 2 * values)
    assert order == [0, 1, 2]


def test_a_part_that_fails_raises_in_the_caller(backend):
    def fail():
        raise RuntimeError("part 1 failed")
    src, host = backend.from_numpy(np.ones(10, np.float32)), np.zeros(10, np.float32)
    with pytest.raises(RuntimeError, match="part 1 failed"):
        backend.reduce_on_host_(src, src, host, [(0, 5, lambda: None), (5, 10, fail)], in_thread=True)


def test_a_data_parallel_run_resumes_exactly(mpiexec, workdir):
    # warmup over all 20 steps: the learning rate then does not depend on --max-steps
    config = write_config(workdir / "c.json", out_dir="dp", warmup_steps=20)
    straight = write_config(workdir / "s.json", out_dir="straight", warmup_steps=20)
    assert launch(mpiexec, 2, "train", "--config", config, "--quiet", "--device", "cpu", "--max-steps", "10"
                  ).returncode == 0
    assert launch(mpiexec, 2, "train", "--config", config, "--quiet", "--device", "cpu", "--resume").returncode == 0
    assert launch(mpiexec, 2, "train", "--config", straight, "--quiet", "--device", "cpu").returncode == 0
    resumed = checkpoint.load(workdir / "dp" / "ckpt.safetensors")
    whole = checkpoint.load(workdir / "straight" / "ckpt.safetensors")
    assert resumed["step"] == 20
    np.testing.assert_allclose(resumed["history"]["train_loss"], whole["history"]["train_loss"], rtol=1e-6)
    assert max_relative_difference(resumed["model"], whole["model"]) <= 1e-6


def test_a_failing_rank_ends_the_job_with_its_error(mpiexec, workdir):
    """Rank 1 has a bad config while rank 0 trains on: the job ends (no rank waits forever for rank 1's
    gradients) with rank 1's one-line error."""
    write_config(workdir / "c.json", out_dir="dp", max_steps=100000)
    script = ("import sys; from tinynn import distributed; from tinynn.cli import main; "
              "config = 'c.json' if distributed.world().rank == 0 else 'missing.json'; "
              "sys.exit(main(['train', '--config', config, '--quiet', '--device', 'cpu']))")
    done = subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert "tinynn: error: rank 1 of 2: config file not found: missing.json" in done.stderr.splitlines()


def test_a_new_batch_shape_frees_the_old_persistent_sums(mpiexec, workdir):
    script = """
import numpy as np
from tinynn import distributed, rng
from tinynn.model import GPT, GPTConfig
from tinynn.optim import AdamW
from tinynn.train_step import REDUCE_PARTS, TrainStep
world = distributed.world()
rng.manual_seed(0)
model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8))
step = TrainStep(model, AdamW(model.parameters(), lr=1e-3), 2, 8, world=world)
for rows in (2, 3, 2):
    x = np.ones((rows, 8), np.int64)
    step(x, x, 1e-3)
    assert len(distributed._open_requests) == REDUCE_PARTS, len(distributed._open_requests)
print(f"rank{world.rank}-ok", flush=True)
"""
    done = subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert "rank0-ok" in done.stdout and "rank1-ok" in done.stdout


def test_under_mpiexec_without_mpi4py_says_what_to_install(workdir, monkeypatch, capsys):
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py now raises ImportError
    monkeypatch.setattr(distributed, "_world", None)
    assert main(["train", "--config", write_config(workdir / "c.json"), "--quiet", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tinynn: error: running under mpiexec (PMI_RANK is set) needs mpi4py")
    assert "pip install 'tinynn-core[mpi]'" in err and len(err.splitlines()) == 1


def test_a_plain_run_never_imports_mpi4py(workdir):
    script = ("import sys; from tinynn.cli import main; "
              "code = main(['train', '--config', 'c.json', '--quiet', '--device', 'cpu', '--max-steps', '2']); "
              "sys.exit(code or ('mpi4py' in sys.modules and 'mpi4py was imported'))")
    env = {k: v for k, v in os.environ.items() if k not in distributed.LAUNCH_VARS}
    write_config(workdir / "c.json", out_dir="plain")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr


def test_an_mpi4py_of_another_mpi_is_refused(mpiexec, workdir):
    """A launcher that started 3 processes while mpi4py's MPI sees 1 (mpi4py linked to another MPI than the
    mpiexec): each process would train alone on the whole batch, so it is an error."""
    env = {**os.environ, "PMI_RANK": "0", "PMI_SIZE": "3"}
    done = subprocess.run([sys.executable, "-m", "tinynn.cli", "train", "--config", write_config(workdir / "c.json"),
                           "--quiet", "--device", "cpu"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("tinynn: error: mpiexec started 3 processes but MPI sees 1")


INTERRUPTIBLE = """
import os, sys
from tinynn import distributed
from tinynn.cli import main
distributed.INTERRUPT_GRACE_S = 2.0
world = distributed.world()
open(f"rank{world.rank}.pid", "w").write(str(os.getpid()))
sys.exit(main(["train", "--config", "c.json", "--quiet", "--device", "cpu"]))
"""


def interrupted(mpiexec, workdir, whom: str):
    """Start a long data-parallel run, send SIGINT to `whom` (mpiexec, as Ctrl-C in its terminal does, or one
    rank alone) once training runs, and return the finished job; a job still running after a minute hangs."""
    import signal
    import time
    write_config(workdir / "c.json", out_dir="dp", max_steps=10**6, eval_interval=10**6, checkpoint_interval=0)
    job = subprocess.Popen([mpiexec, "-n", "2", sys.executable, "-c", INTERRUPTIBLE], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, cwd=workdir)
    pids = [workdir / "rank0.pid", workdir / "rank1.pid"]
    try:
        deadline = time.monotonic() + 60
        while not (all(p.exists() and p.read_text() for p in pids) and (workdir / "dp" / "tinynn.lock").exists()):
            assert job.poll() is None and time.monotonic() < deadline, job.communicate(timeout=5)
            time.sleep(0.1)
        time.sleep(1.0)  # into the steps
        target = job.pid if whom == "mpiexec" else int(pids[int(whom[-1])].read_text())
        os.kill(target, signal.SIGINT)
        out, err = job.communicate(timeout=60)
        return job.returncode, err
    finally:
        if job.poll() is None:  # hung: end it, ranks first
            for p in pids:
                try:
                    os.kill(int(p.read_text()), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
            job.kill()
            job.communicate()


@pytest.mark.parametrize("whom", ["mpiexec", "rank0"])
def test_ctrl_c_ends_every_rank_with_one_message(mpiexec, workdir, whom):
    """Rank 0 stops and ends the job (130) as it exits: no rank is left waiting in a collective (one used to
    sit in MPI_Finalize while the other spun in the Allreduce), and the other rank prints nothing."""
    code, err = interrupted(mpiexec, workdir, whom)
    assert code == 130, err
    assert err.count("tinynn: interrupted") == 1, err


def test_an_interrupt_of_another_rank_alone_ends_the_job(mpiexec, workdir):
    code, err = interrupted(mpiexec, workdir, "rank1")
    assert code == 130, err
    assert "tinynn: error: rank 1 of 2: interrupted, and rank 0 did not end the job within 2 s" in err, err


THREADS = """
import os, sys, warnings
if sys.argv[1] == "no-threadpoolctl":
    sys.modules["threadpoolctl"] = None  # import threadpoolctl now raises ImportError
warnings.simplefilter("always")
warnings.showwarning = lambda message, *args, **kwargs: sys.stdout.write(f"notice: {message}\\n")
from tinynn import distributed
world = distributed.world()
if sys.argv[1] != "no-threadpoolctl":
    from threadpoolctl import threadpool_info
    blas = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
    sys.stdout.write(f"rank {world.rank}: blas {blas}, pool {os.environ.get('TINYNN_NUM_THREADS')}\\n")
"""


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def test_ranks_on_one_machine_share_its_cores(mpiexec, workdir):
    """Two ranks each running a BLAS thread per core (with MPICH polling besides) ran 6-11x slower than one
    process on a 2-core machine: each rank gets its share."""
    pytest.importorskip("threadpoolctl", reason="the [mpi] extra brings threadpoolctl")
    env = {k: v for k, v in os.environ.items() if k not in distributed.THREAD_VARS}
    done = subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", THREADS, "share"], capture_output=True,
                          text=True, timeout=120, cwd=workdir, env=env)
    assert done.returncode == 0, done.stderr
    share = max(1, cores() // 2)
    assert sorted(done.stdout.splitlines()) == [f"rank {r}: blas [{share}], pool {share}" for r in (0, 1)]


def test_a_thread_count_the_user_set_is_kept(mpiexec, workdir):
    pytest.importorskip("threadpoolctl", reason="the [mpi] extra brings threadpoolctl")
    env = {**{k: v for k, v in os.environ.items() if k not in distributed.THREAD_VARS},
           "OPENBLAS_NUM_THREADS": str(cores())}
    done = subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", THREADS, "kept"], capture_output=True,
                          text=True, timeout=120, cwd=workdir, env=env)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [f"rank {r}: blas [{cores()}], pool None" for r in (0, 1)]


def test_without_threadpoolctl_one_notice_says_what_to_set(mpiexec, workdir):
    env = {k: v for k, v in os.environ.items() if k not in distributed.THREAD_VARS}
    done = subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", THREADS, "no-threadpoolctl"],
                          capture_output=True, text=True, timeout=120, cwd=workdir, env=env)
    assert done.returncode == 0, done.stderr
    notices = done.stdout.splitlines()
    assert len(notices) == 1 and "brings threadpoolctl" in notices[0], done.stdout
    assert f"set OMP_NUM_THREADS={max(1, cores() // 2)} for mpiexec" in notices[0]


def test_an_error_every_rank_has_is_printed_once(mpiexec, workdir):
    done = launch(mpiexec, 2, "train", "--config", "missing.json", "--quiet", "--device", "cpu")
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if "tinynn" in line]
    assert errors == ["tinynn: error: rank 0 of 2: config file not found: missing.json"], done.stderr


def test_a_notice_every_rank_has_is_printed_once_and_whole(mpiexec, workdir):
    script = ("import sys, warnings; from tinynn import distributed; from tinynn.errors import TinynnNotice; "
              "warnings.simplefilter('always'); "
              "warnings.showwarning = lambda message, *a, **k: distributed.say(f'tinynn: notice: {message}'); "
              "distributed.world(); warnings.warn('the same on every rank', TinynnNotice)")
    done = subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["tinynn: notice: the same on every rank"], done.stderr
