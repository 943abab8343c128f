"""Checkpoint files: a checksum over the weights and metadata catches bytes damaged inside an otherwise valid
file; checkpoints written before the checksum still load; a damaged file's error is one short line."""
import json
import struct

import numpy as np
import pytest
from safetensors.numpy import save as serialize

from tinynn import checkpoint
from tinynn.errors import TinynnError

STATE = {"optimizer_state": {"step": np.array(3)}, "config": {"n_layer": 1}, "step": 3,
         "rng_state": {"seed": 1}, "history": {"step": [1, 2, 3]}, "chars": ["a", "b"]}


def _write(path, rng):
    model = {"wte.weight": rng.standard_normal((5, 4)).astype(np.float32), "ln.bias": np.zeros(4, np.float32)}
    checkpoint.save(path, model_state=model, **STATE)
    return model


def _header(data: bytes):
    n = struct.unpack("<Q", data[:8])[0]
    return n, json.loads(data[8:8 + n])


def test_weight_bytes_damaged_inside_a_valid_file_are_found(tmp_path, rng):
    path = tmp_path / "ckpt.safetensors"
    model = _write(path, rng)
    loaded = checkpoint.load(path)
    np.testing.assert_array_equal(loaded["model"]["wte.weight"], model["wte.weight"])
    data = bytearray(path.read_bytes())
    n, header = _header(data)
    start = 8 + n + header["model.wte.weight"]["data_offsets"][0]
    data[start + 5] ^= 0x40  # one bit of one weight: still a valid float32, still a valid file
    path.write_bytes(bytes(data))
    with pytest.raises(TinynnError) as e:
        checkpoint.load(path)
    assert str(e.value) == f"checkpoint {path} is damaged: its contents do not match the checksum saved with them"


def test_metadata_damaged_inside_a_valid_file_is_found(tmp_path, rng):
    path = tmp_path / "ckpt.safetensors"
    _write(path, rng)
    data = path.read_bytes()
    damaged = data.replace(b'\\"seed\\": 1', b'\\"seed\\": 7')  # the rng state, as valid JSON
    assert damaged != data and len(damaged) == len(data)
    path.write_bytes(damaged)
    with pytest.raises(TinynnError, match="do not match the checksum"):
        checkpoint.load(path)


def test_a_checkpoint_written_before_the_checksum_still_loads(tmp_path, rng):
    path = tmp_path / "old.safetensors"
    model = {"model.wte.weight": rng.standard_normal((5, 4)).astype(np.float32), "optim.step": np.array(3)}
    metadata = {"format": checkpoint.FORMAT, "config": "{}", "chars": '["a"]', "step": "3",
                "rng_state": "{}", "history": "{}"}
    path.write_bytes(serialize(model, metadata=metadata))
    loaded = checkpoint.load(path)
    assert loaded["step"] == 3
    np.testing.assert_array_equal(loaded["model"]["wte.weight"], model["model.wte.weight"])


def test_a_damaged_header_is_one_short_line(tmp_path, rng):
    path = tmp_path / "ckpt.safetensors"
    _write(path, rng)
    data = path.read_bytes()
    n, _ = _header(data)
    for cut in (b'"history"', b'"config"', b'"step"'):
        at = data.index(cut, 8, 8 + n)
        damaged = data[:at + 2] + b"#" + data[at + 3:]
        path.write_bytes(damaged)
        with pytest.raises(TinynnError) as e:
            checkpoint.load(path)
        assert len(str(e.value)) < 200 + len(str(path)) and "\n" not in str(e.value), str(e.value)
