"""The memory estimate checked before a run builds its model (memory.py): where each backend keeps what."""
import pytest

from fake_backends import FakeGpu, SoftwareGpu
from tinynn import memory, registry
from tinynn.config import TrainConfig
from tinynn.errors import TinynnError
from tinynn.train import train

CFG = TrainConfig(block_size=64, n_layer=2, n_head=2, n_embd=64, batch_size=32)
VOCAB, TOKENS = 65, 100_000


def total(**where) -> int:
    return sum(memory.training_bytes(CFG, VOCAB, TOKENS, **where).values())


def test_a_software_adapters_memory_is_the_hosts():
    """lavapipe's 'GPU memory' is host memory: a run that the CPU cannot fit cannot fit there either, where
    a hardware GPU keeps the same model, activations and logits in memory of its own."""
    cpu, hardware, software = total(), total(on_device=True), total(on_device=True, device_in_host_memory=True)
    assert hardware < cpu <= software
    available = cpu - 1
    with pytest.raises(TinynnError, match="needs about"):
        memory.check(CFG, VOCAB, TOKENS, backend=registry.reference(), available=available)
    memory.check(CFG, VOCAB, TOKENS, backend=FakeGpu(), available=available)
    with pytest.raises(TinynnError, match=r"needs about .* only .* of host memory is available \(llvmpipe \(fake\) "
                                          r"is a software adapter: its GPU memory is host memory\)"):
        memory.check(CFG, VOCAB, TOKENS, backend=SoftwareGpu(), available=available)


def test_the_software_estimate_is_never_below_the_cpus():
    for n_embd, n_layer, block, batch, vocab in [(32, 1, 16, 4, 10), (512, 12, 256, 64, 50_000), (96, 3, 8, 1, 96)]:
        cfg = TrainConfig(n_embd=n_embd, n_head=1, n_layer=n_layer, block_size=block, batch_size=batch)
        cpu = sum(memory.training_bytes(cfg, vocab, 1000).values())
        software = sum(memory.training_bytes(cfg, vocab, 1000, on_device=True, device_in_host_memory=True).values())
        assert software >= cpu


@pytest.mark.filterwarnings("ignore:running on a software adapter")
def test_train_on_a_software_adapter_is_refused_before_the_model_is_built(tmp_path, monkeypatch):
    """The run fits the host as a hardware GPU would use it, not as lavapipe does: refused up front, where it
    was killed by the kernel's out-of-memory killer with no message."""
    try:
        gpu = registry.select("gpu")
    except TinynnError as e:
        pytest.skip(f"no usable GPU backend: {e}")
    if not gpu.is_software:
        pytest.skip(f"{gpu.device_name} is not a software adapter")
    data = tmp_path / "data.txt"
    data.write_text("the quick brown fox jumps over the lazy dog. " * 50)
    cfg = TrainConfig(data=str(data), out_dir=str(tmp_path / "out"), block_size=32, n_layer=1, n_head=2, n_embd=32,
                      batch_size=8, max_steps=2, eval_interval=2, eval_steps=1, sample_tokens=4)
    vocab, n = len(set(data.read_text())), len(data.read_text())
    hardware = sum(memory.training_bytes(cfg, vocab, n, on_device=True).values())
    monkeypatch.setattr(memory, "available_bytes", lambda: hardware)
    with pytest.raises(TinynnError, match="software adapter"):
        train(cfg, device="gpu", progress=False)
    assert not (tmp_path / "out").exists()
