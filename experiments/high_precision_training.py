"""The lesson config trained in both matmul precisions from the same seed: final train and val losses, and their
ratio ("high" should end within 1% of "highest"), with ms per step.

    TINYNN_WEBGPU=dawn python experiments/high_precision_training.py [--steps 500] [--out /tmp/hp]"""
import argparse
import json
import time

from tinynn import config
from tinynn.train import train


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="apps/chargpt/lesson.json")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--out", default="/tmp/high-precision")
    args = parser.parse_args()
    results = {}
    for p in ("highest", "high"):
        cfg = config.load(args.config)
        overrides = {"max_steps": args.steps, "eval_interval": args.steps, "checkpoint_interval": 0,
                     "sample_tokens": 0, "loss_plot": None, "out_dir": f"{args.out}/{p}", "matmul_precision": p}
        cfg = config.from_dict({**config.to_dict(cfg), **overrides}, args.config)
        t = time.perf_counter()
        result = train(cfg, device="gpu", overwrite=True, progress=False)
        h = result.history
        results[p] = {"train_loss": h["train_loss"][-1], "val_loss": h["val_loss"][-1],
                      "seconds": round(time.perf_counter() - t, 1)}
        print(p, json.dumps(results[p]), flush=True)
    ratio = results["high"]["val_loss"] / results["highest"]["val_loss"]
    print(f"val loss high / highest = {ratio:.4f} (within 1%: {abs(ratio - 1) <= 0.01})")


if __name__ == "__main__":
    main()
