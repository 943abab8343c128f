"""The `tinynn` command: train, generate, prepare (text to token files), export (a GPT-2 folder), demo, info
and bench.

Bad input (a config key or flag, a missing file, a corrupt checkpoint, an unknown character in a prompt) prints
one line, `tinynn: error: ...`, and exits with code 2; nothing already saved is touched. Warnings become
one-line notices, `tinynn: notice: ...`; NumPy's floating-point warnings are silenced, since a non-finite
loss stops training with its own error. Output to a pipe whose reader has gone (`| head`) is dropped:
training goes on to its checkpoint; generate stops, with exit code 141 (a program ended by SIGPIPE).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import warnings

import numpy as np

from tinynn import __version__, distributed, registry
from tinynn.errors import TinynnError

BROKEN_PIPE = 141  # the exit code of a program ended by a closed pipe (128 + SIGPIPE), as a shell reports it


def cmd_train(args):
    from tinynn import config, rundir
    from tinynn.train import drop_stdout, train
    distributed.world()  # under mpiexec, connected first: rank 0 alone reports what loading the config says
    cfg = config.load(args.config, overrides={"--out-dir": ("out_dir", args.out_dir),
                                              "--max-steps": ("max_steps", args.max_steps),
                                              "--init-from": ("init_from", args.init_from)})
    result = train(cfg, device=args.device, resume=args.resume, overwrite=args.overwrite, progress=not args.quiet)
    if not distributed.world().is_root:  # data-parallel: rank 0 alone reports
        return
    if result.checkpoint is None:  # a run that leaves no model is a failure, whatever its last loss
        raise TinynnError(f"no checkpoint saved in {cfg.out_dir}: every checkpoint step's loss was more than "
                          f"{rundir.DIVERGENCE:g}x the best (the run diverged); try a lower learning_rate or a "
                          "grad_clip")
    try:  # a reader that has gone (`| head -1`) does not turn a finished run into a failure
        print(f"checkpoint: {result.checkpoint}")
        if result.plot:
            print(f"loss curve: {result.plot}")
        print("sample:")
        print(result.sample, flush=True)
    except BrokenPipeError:
        drop_stdout()


def cmd_generate(args):
    from tinynn import checkpoint, generate, hf, rng
    from tinynn import tokenizer as tokenizers
    from tinynn.config import from_dict
    from tinynn.model import GPT
    flags = {"max_new_tokens": "--max-new-tokens", "temperature": "--temperature", "top_k": "--top-k",
             "seed": "--seed"}
    generate.check(args.max_new_tokens, args.temperature, args.top_k, args.seed, names=flags)
    if args.num_samples < 1:
        raise TinynnError(f"--num-samples must be at least 1, got {args.num_samples}")
    backend = registry.set_default(args.device)
    rng.manual_seed(0)
    if hf.is_folder(args.checkpoint):  # a Hugging Face GPT-2 folder
        pretrained = hf.load(args.checkpoint)
        if pretrained.tokenizer is None:
            raise TinynnError(f"{args.checkpoint} has no tokenizer.json to encode the prompt and decode the tokens")
        model, tokenizer = hf.build(pretrained, dropout=0.0), pretrained.tokenizer
    else:
        saved = checkpoint.load(args.checkpoint)
        tokenizer = tokenizers.from_spec(saved["tokenizer"], f"checkpoint {args.checkpoint}")
        cfg = from_dict(saved["config"], f"checkpoint {args.checkpoint}")
        vocab_size = checkpoint.vocab_size(saved) or tokenizer.vocab_size
        model = GPT(cfg.model_config(vocab_size))  # a fine-tuned GPT-2's may exceed its tokenizer's
        model.load_state_dict(saved["model"])
    model = generate.for_tokenizer(model, tokenizer.vocab_size, args.checkpoint)
    start_id = getattr(tokenizer, "eot_id", None) or 0  # no prompt: BPE starts a document, char its first character
    try:
        prompt = tokenizer.encode(args.prompt) if args.prompt else np.array([start_id], dtype=np.int64)
    except TinynnError as e:
        raise TinynnError(f"--prompt: {e} (the tokenizer of {args.checkpoint})") from None
    prompts = np.repeat(prompt[None, :], args.num_samples, axis=0)  # (N, T): the samples decode as one batch
    sampling = {"temperature": args.temperature, "top_k": args.top_k, "seed": args.seed,
                "use_cache": not args.no_cache}
    start = time.perf_counter()
    if args.num_samples == 1:  # streamed: each token printed as soon as it is drawn
        decode = tokenizer.stream_decoder()  # a character split over two BPE tokens comes out whole
        print(decode(prompt) if args.prompt or tokenizer.kind == "char" else "", end="", flush=True)
        for ids in model.stream(prompts, args.max_new_tokens, **sampling):
            print(decode(ids), end="", flush=True)
        print()
    else:  # several samples: read back in blocks, printed whole at the end
        out = model.generate(prompts, args.max_new_tokens, **sampling)
        print("\n---\n".join(tokenizer.decode(row) for row in out))
    seconds = time.perf_counter() - start
    made = args.num_samples * args.max_new_tokens
    print(f"{made} tokens in {seconds:.2f} s: {made / max(seconds, 1e-9):,.0f} tokens/s on {backend.device_name} "
          f"({backend.name}{', no cache' if args.no_cache else ''})", file=sys.stderr)


def cmd_prepare(args):
    from tinynn.prepare import prepare
    meta = prepare(args.data, args.out, tokenizer=args.tokenizer, vocab_size=args.vocab_size,
                   val_fraction=args.val_fraction, overwrite=args.overwrite, progress=not args.quiet)
    print(f"wrote {args.out}: {meta['train_tokens']:,} train and {meta['val_tokens']:,} val tokens "
          f"({meta['dtype']}), a {meta['tokenizer']['type']} tokenizer of {meta['vocab_size']:,} tokens")


def cmd_export(args):
    from tinynn import hf
    from tinynn.errors import TinynnNotice
    for note in hf.export_checkpoint(args.checkpoint, args.out, overwrite=args.overwrite):
        warnings.warn(note, TinynnNotice)
    print(f"wrote {args.out}: config.json, model.safetensors and tokenizer.json "
          "(transformers: GPT2LMHeadModel.from_pretrained)")


def cmd_demo(args):
    from tinynn import demo
    unknown = sorted(set(args.which) - set(demo.DEMOS))
    if unknown:
        raise TinynnError(f"no demo numbered {unknown[0]} (there are {', '.join(map(str, demo.DEMOS))})")
    registry.set_default(args.device)
    demo.run(args.which)


def info(device: str | None = None) -> dict:
    active, error = registry.selection(device)  # a device that cannot run: the report, then its error
    return {
        "tinynn": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "backends": [{"name": s.name, "usable": s.backend is not None, "reason": s.reason,
                      **(s.backend.describe() if s.backend else {})} for s in registry.statuses()],
        "active": active.describe() if active else None,
        "error": error or None,
        "why_not_gpu": None if active and active.is_gpu else registry.why_not_gpu() or None,
    }


def cmd_info(args):
    report = info(args.device)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_info(report)
    if report["error"]:  # for scripts: the device asked for cannot run here
        raise TinynnError(report["error"])


def print_info(report):
    print(f"tinynn {report['tinynn']}  (python {report['python']}, numpy {report['numpy']})")
    print("backends:")
    for b in report["backends"]:
        if b["usable"]:
            kind = ", ".join(str(b[k]) for k in ("adapter_type", "graphics_backend") if b.get(k))
            detail = b["device"] + (f" ({kind})" if kind else "") + (" [software adapter]" if b["software"] else "")
        else:
            detail = b["reason"]
        print(f"  {b['name']:<6} {'usable' if b['usable'] else 'unavailable':<12} {detail}")
    active = report["active"]
    print(f"active: {active['backend']} ({active['device']})" if active else "active: none")
    for key, value in (active or {}).items():  # what the backend says of itself: how it records, and why
        if key not in ("backend", "device", "software"):
            print(f"  {key}: {value}")
    if report["why_not_gpu"] and not report["error"]:  # the error says it
        print(f"GPU not used: {report['why_not_gpu']}")


def cmd_bench(args):
    from tinynn import bench
    bench.main(args)


class _HelpWithDefaults(argparse.HelpFormatter):
    """An option's help ends with its default, unless the help already says it or it has none (a switch)."""

    def _get_help_string(self, action):
        unsaid = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        if "(default:" in action.help or unsaid or not action.option_strings:
            return action.help
        return f"{action.help} (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tinynn", description="A small, readable neural-network framework.")
    parser.add_argument("--version", action="version", version=f"tinynn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name, help):
        p = sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".",
                           formatter_class=_HelpWithDefaults)
        p.add_argument("--device", choices=registry.DEVICES, default=None,
                       help="auto: a hardware GPU when present, else the CPU; gpu also takes a software adapter "
                            "(default: TINYNN_DEVICE, else auto)")
        return p

    p = command("train", "train a GPT from a JSON config")
    p.add_argument("--config", required=True, help="path to the JSON config (README: Config reference)")
    p.add_argument("--resume", action="store_true", help="continue from out_dir's checkpoint (Ctrl-C saves one)")
    p.add_argument("--overwrite", action="store_true", help="start afresh, replacing out_dir's checkpoint (not with "
                                                            "--resume)")
    p.add_argument("--out-dir", help="override the config's out_dir; a loss_plot inside it moves too (default: the "
                                     "config's)")
    p.add_argument("--max-steps", type=int, help="override the config's max_steps (default: the config's)")
    p.add_argument("--init-from", help="fine-tune a Hugging Face GPT-2 folder (default: the config's init_from)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)

    p = command("generate", "sample text from a checkpoint")
    p.add_argument("--checkpoint", required=True,
                   help="a checkpoint written by tinynn train, or a Hugging Face GPT-2 folder")
    p.add_argument("--prompt", default="", help="text to continue (default: a BPE's end-of-text token, else the "
                                                         "vocabulary's first character)")
    p.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate")
    p.add_argument("--temperature", type=float, default=0.8, help="sampling temperature; 0 picks the likeliest")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest (default: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling")
    p.add_argument("--num-samples", type=int, default=1, help="samples decoded together as one batch")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole context for every token")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("prepare", help="tokenize text into train.bin and val.bin (nanoGPT's layout)",
                       description="Tokenize a UTF-8 text file, a folder of them or the built-in corpus into "
                                   "train.bin, val.bin and meta.json, streamed.", formatter_class=_HelpWithDefaults)
    p.add_argument("data", nargs="?", default=None, help="a text file or a folder of them (default: the built-in "
                                                         "corpus)")
    p.add_argument("--out", required=True, help="the folder to write (a config's data)")
    p.add_argument("--tokenizer", default="char", help="char, bpe (trained on the data) or a tokenizer.json")
    p.add_argument("--vocab-size", type=int, help="the bpe tokenizer's vocabulary, e.g. 2048 (default: none; "
                                                   "--tokenizer bpe needs it)")
    p.add_argument("--val-fraction", type=float, default=0.1, help="the share of tokens, at the end, for val.bin")
    p.add_argument("--overwrite", action="store_true", help="replace the token files already in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("export", help="write a checkpoint as a Hugging Face GPT-2 folder",
                       description="Write a checkpoint as a Hugging Face GPT-2 folder (config.json, "
                                   "model.safetensors, tokenizer.json) that transformers loads.",
                       formatter_class=_HelpWithDefaults)
    p.add_argument("checkpoint", help="a checkpoint written by tinynn train")
    p.add_argument("out", help="the folder to write")
    p.add_argument("--format", choices=["hf"], required=True, help="hf: Hugging Face's GPT-2 layout")
    p.add_argument("--overwrite", action="store_true", help="write into a folder that is not empty")
    p.set_defaults(func=cmd_export)

    p = command("demo", "run the demos (all, or the numbered ones)")
    p.add_argument("which", nargs="*", type=int, help="demo numbers, 1 to 4 (default: all)")
    p.set_defaults(func=cmd_demo)

    p = command("info", "versions, backends, and the active device")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_info)

    p = command("bench", "matmul and training-step benchmarks")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--sizes", default="256,512,1024,2048,4096", help="matmul sizes, comma-separated")
    p.add_argument("--config", default=None, help="training config to time (default: the lesson's scale)")
    p.add_argument("--steps", type=int, default=20, help="timed training steps")
    p.add_argument("--profile", action="store_true", help="GPU time per kernel (needs timestamp queries)")
    p.add_argument("--no-cpu", action="store_true",
                   help="time the GPU backend alone (NumPy takes seconds a step at the big config)")
    p.set_defaults(func=cmd_bench)
    return parser


def _notice(message, category, filename, lineno, file=None, line=None):
    distributed.say(f"tinynn: notice: {message}")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("always")
            warnings.showwarning = _notice
            args.func(args)
    except TinynnError as e:
        return distributed.fail(str(e), 2)  # prints `tinynn: error: ...`; under MPI it ends every rank
    except MemoryError:  # a backstop: train checks its estimate first (memory.py)
        smaller = "ask for fewer --num-samples" if args.command == "generate" else \
            "make the model, the batch or the vocabulary smaller"
        return distributed.fail(f"out of memory: {smaller}", 2)
    except KeyboardInterrupt as e:  # train's says where its checkpoint is (train.Interrupted)
        distributed.say(f"tinynn: interrupted {e}" if str(e) else "tinynn: interrupted")
        return distributed.INTERRUPTED
    except BrokenPipeError:  # stdout's reader has gone (`tinynn generate | head -c 20`): stop, as head meant
        from tinynn.train import drop_stdout
        drop_stdout()
        return BROKEN_PIPE
    return 0


if __name__ == "__main__":
    sys.exit(main())
