"""The `tinynn` command: train, generate, demo, info and bench.

Bad input (a config key, a missing file, a corrupt checkpoint, an unknown character in a prompt) prints one
line, `tinynn: error: ...`, and exits with code 2; nothing already saved is touched.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys

import numpy as np

from tinynn import __version__, backends, distributed
from tinynn.errors import TinynnError


def cmd_train(args):
    from tinynn import config
    from tinynn.train import train
    cfg = config.load(args.config)
    if args.out_dir:
        cfg.out_dir = args.out_dir
    if args.max_steps:
        cfg.max_steps = args.max_steps
    result = train(cfg, device=args.device, resume=args.resume, progress=not args.quiet)
    if not distributed.world().is_root:  # data-parallel: rank 0 alone reports
        return
    print(f"checkpoint: {result.checkpoint}")
    if cfg.loss_plot:
        print(f"loss curve: {cfg.loss_plot}")
    print("sample:")
    print(result.sample)


def cmd_generate(args):
    from tinynn import checkpoint, rng
    from tinynn.config import from_dict
    from tinynn.data import CharTokenizer
    from tinynn.model import GPT
    backends.set_default(args.device)
    saved = checkpoint.load(args.checkpoint)
    tokenizer = CharTokenizer(saved["chars"])
    cfg = from_dict(saved["config"], f"checkpoint {args.checkpoint}")
    rng.manual_seed(0)
    model = GPT(cfg.model_config(tokenizer.vocab_size))
    model.load_state_dict(saved["model"])
    prompt = tokenizer.encode(args.prompt) if args.prompt else np.zeros(1, dtype=np.int64)
    out = model.generate(prompt[None, :], args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                         rng=np.random.default_rng(args.seed))
    print(tokenizer.decode(out[0]))


def cmd_demo(args):
    from tinynn import demo
    unknown = sorted(set(args.which) - set(demo.DEMOS))
    if unknown:
        raise TinynnError(f"no demo numbered {unknown[0]} (there are {', '.join(map(str, demo.DEMOS))})")
    backends.set_default(args.device)
    demo.run(args.which)


def info() -> dict:
    try:
        active = backends.select(None)
    except TinynnError:  # TINYNN_DEVICE=gpu without a usable GPU: the report says why
        active = None
    return {
        "tinynn": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "backends": [{"name": s.name, "usable": s.backend is not None, "reason": s.reason,
                      **(s.backend.describe() if s.backend else {})} for s in backends.statuses()],
        "active": active.describe() if active else None,
        "why_not_gpu": None if active and active.is_gpu else backends.why_not_gpu() or None,
    }


def cmd_info(args):
    if args.device:
        backends.set_default(args.device)
    report = info()
    if args.json:
        print(json.dumps(report, indent=2))
        return
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
    print(f"active: {active['backend']} ({active['device']})" if active else "active: none (see TINYNN_DEVICE)")
    if report["why_not_gpu"]:
        print(f"GPU not used: {report['why_not_gpu']}")


def cmd_bench(args):
    from tinynn import bench
    bench.main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tinynn", description="A small, readable neural-network framework.")
    parser.add_argument("--version", action="version", version=f"tinynn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_device(p):
        p.add_argument("--device", choices=backends.DEVICES, default=None,
                       help="auto (default; TINYNN_DEVICE overrides): a hardware GPU when present, else the CPU")
        return p

    p = with_device(sub.add_parser("train", help="train a character-level GPT from a JSON config"))
    p.add_argument("--config", required=True, help="path to the JSON config (see README)")
    p.add_argument("--resume", action="store_true", help="continue from out_dir's checkpoint")
    p.add_argument("--out-dir", help="override the config's out_dir")
    p.add_argument("--max-steps", type=int, help="override the config's max_steps")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)

    p = with_device(sub.add_parser("generate", help="sample text from a checkpoint"))
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--prompt", default="")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_generate)

    p = with_device(sub.add_parser("demo", help="run the demos (all, or the numbered ones)"))
    p.add_argument("which", nargs="*", type=int, help="demo numbers, 1 to 4 (default: all)")
    p.set_defaults(func=cmd_demo)

    p = with_device(sub.add_parser("info", help="versions, backends, and the active device"))
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_info)

    p = with_device(sub.add_parser("bench", help="matmul and training-step benchmarks"))
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--sizes", default="256,512,1024,2048,4096", help="matmul sizes, comma-separated")
    p.add_argument("--config", default=None, help="training config to time (default: the lesson's scale)")
    p.add_argument("--steps", type=int, default=20, help="timed training steps")
    p.add_argument("--profile", action="store_true", help="GPU time per kernel (needs timestamp queries)")
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except TinynnError as e:
        return distributed.fail(str(e), 2)  # prints `tinynn: error: ...`; under MPI it ends every rank
    except KeyboardInterrupt:
        print("tinynn: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
