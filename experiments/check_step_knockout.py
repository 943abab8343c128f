"""Checks of step_knockout.py's tape surgery (an experiment's own checks, not the package's tests): a kind's
dispatches leave the replayed step, the result's read-back keeps its place, and the full tape, put back, computes
the step as before.

    XDG_RUNTIME_DIR=/tmp python -m pytest experiments/check_step_knockout.py -p no:cacheprovider
"""
import importlib.util
from pathlib import Path

import numpy as np

from tinynn import bench
from tinynn.config import TrainConfig


def load_knockout():
    path = Path(__file__).parent / "step_knockout.py"
    spec = importlib.util.spec_from_file_location("step_knockout", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_drops_a_kind_and_moves_the_result_event():
    knockout = load_knockout()

    class Pipe:
        def __init__(self, label):
            self.label = label
    write = ("write", None, b"", 0)
    events = [write, ("dispatch", Pipe("layernorm.layernorm_forward_main"), None, (1, 1, 1)),
              ("dispatch", Pipe("matmul 64x64.matmul_main"), None, (1, 1, 1)),
              ("dispatch", Pipe("layernorm.layernorm_forward_main"), None, (1, 1, 1)),
              ("dispatch", Pipe("matmul 64x64.matmul_finish_main"), None, (1, 1, 1))]
    kept, result_at, dropped = knockout.without(events, 3, "layernorm_forward")
    assert dropped == 2 and [e[1] for e in kept] == [None, events[2][1], events[4][1]]
    assert result_at == 1  # the result's event left: the last one kept before it, the matmul
    kept, result_at, dropped = knockout.without(events, 4, "matmul_finish_main$")
    assert dropped == 1 and len(kept) == 4 and result_at == 3


def test_knockout_then_full_tape_gives_the_steps_loss():
    from tinynn import registry
    gpu = registry.select("gpu")
    knockout = load_knockout()
    cfg = TrainConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, batch_size=2)
    train_step, x = bench.lesson_step(gpu, cfg)
    losses = [train_step(x, x, 0.0).item() for _ in range(4)]  # lr 0: every step computes the same loss
    tape = train_step._run.tape
    assert tape is not None  # captured, and replayed
    events, result_event = list(tape.events), tape.result_event
    kept, result_at, dropped = knockout.without(events, result_event, r"adamw")
    assert dropped >= 1
    knockout.use_events(tape, kept, result_at)
    assert [e for e in tape.events if e[0] == "dispatch" and "adamw" in e[1].label] == []
    train_step(x, x, 0.0).item()
    (program, _), = tape.programs.values()  # compiled again, from the events kept
    replayed = sum(len(dispatches) for kind, runs in program if kind == "dispatches" for _, dispatches in runs)
    assert replayed == sum(e[0] == "dispatch" for e in events) - dropped
    knockout.use_events(tape, events, result_event)
    assert np.isclose(train_step(x, x, 0.0).item(), losses[-1], rtol=1e-6)
