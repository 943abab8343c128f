"""Generation (tinynn/generate.py) on every backend: the KV cache gives the full recompute's tokens, past
block_size too; a seed fixes the text; streaming yields generate's tokens; the sampling op draws from the
distribution it defines; bad values are one-line errors, exit 2 on the command line."""
import numpy as np
import pytest

import tinynn
from tinynn import backends, checkpoint, config, generate
from tinynn.cli import main
from tinynn.data import CharTokenizer
from tinynn.errors import TinynnError, TinynnNotice
from tinynn.model import GPT, GPTConfig
from tinynn.numpy_backend import uniform
from tinynn.tensor import no_grad

TINY = GPTConfig(vocab_size=20, block_size=16, n_layer=2, n_head=2, n_embd=16)


def chaotic_gpt(backend, cfg=TINY) -> GPT:
    """A random GPT with its matrices scaled up: varied greedy text and logits far apart, so the cache's
    rounding (another summation order) cannot change a choice."""
    tinynn.manual_seed(0)
    model = GPT(cfg).to("cpu")
    for p in model.parameters():
        if p.ndim == 2:
            p.backend.write_(p.data, p.numpy() * 20)
    return model.to(backend)


def recompute(model, idx, max_new_tokens):
    """Greedy decoding as the definition: the whole last-block_size window through forward for every token."""
    with no_grad():
        for _ in range(max_new_tokens):
            logits, _ = model(idx[:, -model.config.block_size:])
            idx = np.concatenate([idx, logits.numpy()[:, -1].argmax(-1)[:, None]], axis=1)
    return idx


def test_greedy_with_the_cache_is_the_full_recompute_past_block_size(backend):
    model = chaotic_gpt(backend)
    prompt = np.array([[1, 2, 3], [7, 7, 7]])
    new = TINY.block_size - 3 + 300  # 300 tokens after the window starts sliding
    cached = model.generate(prompt, new, temperature=0)
    assert cached.shape == (2, 3 + new) and len(set(cached[0, -100:].tolist())) > 3  # not one repeated token
    np.testing.assert_array_equal(model.generate(prompt, new, temperature=0, use_cache=False), cached)
    short = TINY.block_size + 4  # the definition is slow: the window's first steps and a few past it
    np.testing.assert_array_equal(recompute(model, prompt, short), cached[:, :3 + short])


def test_a_seed_fixes_the_text_and_streaming_yields_the_same_tokens(backend):
    model = chaotic_gpt(backend)
    prompt = np.array([[4, 5], [4, 5], [9, 1]])
    first = model.generate(prompt, 30, temperature=1.5, top_k=6, seed=11)
    np.testing.assert_array_equal(model.generate(prompt, 30, temperature=1.5, top_k=6, seed=11), first)
    assert not np.array_equal(model.generate(prompt, 30, temperature=1.5, top_k=6, seed=12), first)
    assert not np.array_equal(first[0], first[1])  # equal prompts in one batch draw independently
    streamed = np.stack(list(model.stream(prompt, 30, temperature=1.5, top_k=6, seed=11)), axis=1)
    np.testing.assert_array_equal(streamed, first[:, 2:])
    assert model.training  # generation switched dropout off only while it ran


def test_a_prompt_longer_than_the_window_and_zero_new_tokens(backend):
    model = chaotic_gpt(backend)
    prompt = np.arange(40)[None, :] % TINY.vocab_size
    np.testing.assert_array_equal(model.generate(prompt, 0), prompt)
    np.testing.assert_array_equal(model.generate(prompt, 5, temperature=0), recompute(model, prompt, 5))


def test_a_repeated_call_restarts_the_last_decoder_but_not_under_a_paused_stream(backend):
    model = chaotic_gpt(backend)
    first, second = np.array([[4, 5, 6]]), np.array([[9, 2]])
    sampling = {"temperature": 1.0, "top_k": 5, "seed": 3}
    want_first = chaotic_gpt(backend).generate(first, 25, **sampling)  # each from a decoder of its own
    want_second = chaotic_gpt(backend).generate(second, 25, **sampling)
    np.testing.assert_array_equal(model.generate(first, 25, **sampling), want_first)
    decoder = model._last_decoder
    np.testing.assert_array_equal(model.generate(second, 25, **sampling), want_second)
    assert model._last_decoder is decoder  # restarted, its recorded steps reused
    paused = model.stream(first, 25, **sampling)
    head = next(paused)
    np.testing.assert_array_equal(model.generate(second, 25, **sampling), want_second)
    assert model._last_decoder is not decoder  # the stream's decoder was busy
    np.testing.assert_array_equal(np.stack([head, *paused], axis=1), want_first[:, 3:])
    p = model.parameters()[0]
    p.data = backend.from_numpy(p.numpy())  # a new array: what the recorded steps read is gone
    decoder = model._last_decoder
    np.testing.assert_array_equal(model.generate(second, 25, **sampling), want_second)
    assert model._last_decoder is not decoder


def test_sample_tokens_draws_from_its_distribution():
    be = backends.reference()
    logits = np.log(np.array([[0.1, 0.2, 0.3, 0.4, 1e-12]], np.float32))
    tokens, ids = np.zeros((1, 4), np.int32), np.zeros(1, np.int32)
    counts = np.zeros(5)
    draws = 4000
    for n in range(draws):
        be.sample_tokens_(logits, tokens, np.array([n], np.int32), ids, temperature=1.0, top_k=5, seed=3)
        counts[ids[0]] += 1
        assert tokens[0, n % 4] == ids[0]
    np.testing.assert_allclose(counts / draws, [0.1, 0.2, 0.3, 0.4, 0.0], atol=0.03)
    for n in range(50):  # top_k 2: only the two likeliest; temperature 0: the first largest
        be.sample_tokens_(logits, tokens, np.array([n], np.int32), ids, temperature=1.0, top_k=2, seed=3)
        assert ids[0] in (2, 3)
    be.sample_tokens_(np.array([[1.0, 3.0, 3.0]], np.float32), tokens, np.array([0], np.int32), ids,
                      temperature=0.0, top_k=3, seed=0)
    assert ids[0] == 1
    u = uniform(0, np.arange(4096), 0)
    assert u.dtype == np.float32 and 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.02


@pytest.mark.parametrize("kwargs, field", [({"max_new_tokens": -1}, "max_new_tokens"), ({"top_k": 0}, "top_k"),
                                           ({"temperature": float("nan")}, "temperature"),
                                           ({"temperature": -0.5}, "temperature"), ({"seed": -1}, "seed"),
                                           ({"seed": 2**32}, "seed")])
def test_bad_arguments_name_the_parameter(kwargs, field):
    model = chaotic_gpt(backends.reference())
    args = {"max_new_tokens": 3, **kwargs}
    with pytest.raises(TinynnError, match=field):
        model.generate(np.array([[1]]), **args)
    with pytest.raises(TinynnError, match=field):
        model.stream(np.array([[1]]), **args)  # refused at the call, not at the first token


@pytest.fixture
def saved_model(tmp_path, monkeypatch):
    """A checkpoint of chaotic_gpt with a 20-character tokenizer, as `tinynn train` writes one."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TINYNN_DEVICE", "cpu")
    chars = "abcdefghij klmnopqr."
    cfg = config.TrainConfig(block_size=16, n_layer=2, n_head=2, n_embd=16)
    model = chaotic_gpt(backends.reference())
    checkpoint.save(tmp_path / "ckpt.safetensors", model_state=model.state_dict(), optimizer_state={},
                    config=config.to_dict(cfg), chars=list(chars), step=0, rng_state={}, history={})
    return str(tmp_path / "ckpt.safetensors"), CharTokenizer(chars)


def test_cli_streams_and_matches_no_cache(saved_model, capsys):
    path, _ = saved_model
    args = ["generate", "--checkpoint", path, "--prompt", "abc", "--max-new-tokens", "40", "--temperature", "0"]
    assert main(args) == 0
    cached = capsys.readouterr()
    assert cached.out.startswith("abc") and len(cached.out) == 3 + 40 + 1
    assert "40 tokens in" in cached.err and "tokens/s on NumPy (cpu)" in cached.err
    assert main(args + ["--no-cache"]) == 0
    assert capsys.readouterr().out == cached.out
    assert main(args[:-2] + ["--num-samples", "3", "--seed", "5"]) == 0
    samples = capsys.readouterr()
    assert samples.out.count("\n---\n") == 2 and "120 tokens in" in samples.err


def test_a_model_predicting_more_tokens_than_its_tokenizer_samples_only_the_tokenizers(tmp_path, monkeypatch,
                                                                                      capsys):
    """A GPT-2 folder may pad its 50257 tokens to 50304 (nanoGPT's do): ids past the tokenizer have no text, so
    they are never drawn, however likely the model makes them."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TINYNN_DEVICE", "cpu")
    chars = "abcdefghijklmno"  # 15 of the model's 20 tokens
    model = chaotic_gpt(backends.reference())
    state = model.state_dict()
    state["lm_head.bias"][len(chars):] = 50.0  # the ids with no text: by far the likeliest
    cfg = config.TrainConfig(block_size=16, n_layer=2, n_head=2, n_embd=16)
    checkpoint.save(tmp_path / "ckpt.safetensors", model_state=state, optimizer_state={}, config=config.to_dict(cfg),
                    chars=list(chars), step=0, rng_state={}, history={}, vocab_size=20)
    for extra in ([], ["--num-samples", "2"]):
        assert main(["generate", "--checkpoint", "ckpt.safetensors", "--prompt", "abc", "--max-new-tokens", "30",
                     "--seed", "1", *extra]) == 0
        out, err = capsys.readouterr()
        assert set(out.strip().replace("\n---\n", "")) <= set(chars) and len(out.strip()) >= 33
        assert "ids 15 to 19 have no text and are never sampled" in err
    model.load_state_dict(state)
    with pytest.warns(TinynnNotice, match="^here: the model predicts 20 tokens, its tokenizer has 15"):
        narrowed = generate.for_tokenizer(model, len(chars), "here")
    with no_grad():
        logits = model(np.array([[1, 2]]))[0].numpy()
        assert np.allclose(narrowed(np.array([[1, 2]]))[0].numpy(), logits[..., :len(chars)])


def test_running_out_of_memory_names_the_flag_that_asks_for_it(saved_model, monkeypatch, capsys):
    """Each sample keeps its own keys and values: --num-samples is what a user sets too high."""
    def too_many(*args, **kwargs):
        raise MemoryError
    monkeypatch.setattr(GPT, "generate", too_many)
    assert main(["generate", "--checkpoint", saved_model[0], "--num-samples", "100000000"]) == 2
    assert capsys.readouterr().err == "tinynn: error: out of memory: ask for fewer --num-samples\n"


@pytest.mark.parametrize("flag, value", [("--max-new-tokens", "-1"), ("--top-k", "0"), ("--temperature", "nan"),
                                         ("--temperature", "-1"), ("--seed", "-3"), ("--num-samples", "0")])
def test_cli_bad_values_are_one_line_exit_2(saved_model, capsys, flag, value):
    path, _ = saved_model
    assert main(["generate", "--checkpoint", path, flag, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tinynn: error: {flag} ") and err.count("\n") == 1, err
