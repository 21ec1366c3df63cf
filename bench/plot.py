"""Plots of a ``bench/peers.py compare`` run: output throughput vs concurrency, and TTFT / TPOT
percentiles per engine (PNG, matplotlib).

    pip install matplotlib      # a benchmark tool, not a trillium dependency
    python bench/plot.py bench/results/compare.json --out bench/results/
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("result", help="JSON written by bench/peers.py compare")
    p.add_argument("--out", default=".", help="directory for the PNG files")
    args = p.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("bench/plot.py needs matplotlib: pip install matplotlib")
    with open(args.result) as f:
        engines = json.load(f)["engines"]
    os.makedirs(args.out, exist_ok=True)

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, run in engines.items():
        rows = sorted(run["rows"], key=lambda r: r["concurrency"])
        ax.plot([r["concurrency"] for r in rows], [r["output_throughput"] for r in rows], marker="o", label=name)
    ax.set(xscale="log", xlabel="concurrent streams", ylabel="output tokens/s", title="Throughput vs concurrency")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "throughput.png"), dpi=120)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric, label in ((axes[0], "ttft", "TTFT ms"), (axes[1], "tpot", "TPOT ms")):
        for name, run in engines.items():
            rows = sorted(run["rows"], key=lambda r: r["concurrency"])
            xs = [r["concurrency"] for r in rows]
            for q, style in (("p50", "-"), ("p99", "--")):
                ax.plot(xs, [r[f"{metric}_{q}_ms"] for r in rows], style, marker="o", label=f"{name} {q}")
        ax.set(xscale="log", yscale="log", xlabel="concurrent streams", ylabel=label, title=f"{label} percentiles")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "latency.png"), dpi=120)
    print(f"wrote {args.out}/throughput.png and {args.out}/latency.png")


if __name__ == "__main__":
    main()
