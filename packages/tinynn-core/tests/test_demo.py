"""`tinynn demo`'s long parts show progress (what each demo computes is checked in test_cli.py)."""
from tinynn import demo, registry


def test_demo_3_shows_its_training_on_stderr(capsys):
    """Its training runs for seconds on a CPU and longer on a GPU's first use: the bar shows it moving,
    on stderr, beside the demo's own lines."""
    lines = []
    registry.set_default("cpu")
    demo.demo_gpt(out=lines.append, steps=12)
    captured = capsys.readouterr()
    assert "train (cpu)" in captured.err and "12/12" in captured.err, captured.err
    assert lines[0] == "demo 3: a tiny GPT on the embedded corpus" and "in 12 steps" in lines[1]


def test_demo_3_can_run_without_a_bar(capsys):
    registry.set_default("cpu")
    demo.demo_gpt(out=lambda line: None, steps=12, progress=False)
    assert "train (" not in capsys.readouterr().err
