"""Time a linear layer's product both ways on this CPU, cold cache (docs/design-notes.md, engine/cpu_linear.py):
torch's F.linear (x·Wᵀ) against W·xᵀ as the W·xᵀ layout computes it (``cpu_linear.weight_first_linear``), for the
teacher's layer shapes and row counts; then the pass ``NAT_LINEAR_LAYOUT=auto`` times to choose the layout, over one
layer of each of these shapes (``cpu_linear.time_layouts``, warm cache), and the layout it would choose.

    python dev/bench_linear_layout.py [--threads 2] [--repeats 200]
"""

import argparse
import time

import torch
import torch.nn.functional as F

from nat_plugins.engine.cpu_linear import TORCH, WEIGHT_FIRST, time_layouts, weight_first_linear

SHAPES = [(256, 256), (1024, 256), (256, 1024), (7800, 256)]  # (out, in): attention, FFN in/out, output projection
ROWS = [1, 2, 3, 4, 8, 16, 64, 256, 512]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    evict = torch.zeros(16 * 1024 * 1024)  # 64 MB, more than the last-level cache: weights come from memory

    def microseconds(fn, *inputs):
        total = 0.0
        for _ in range(args.repeats):
            evict.add_(1.0)
            start = time.perf_counter()
            fn(*inputs)
            total += time.perf_counter() - start
        return total / args.repeats * 1e6

    # rows that are another layer's W·xᵀ output lie transposed (x = yᵀ, y row-major): WeightFirstLinear copies them
    # row-major first; the last two columns time that against the product on the rows as they lie
    print(
        "| weight (out x in) | rows | F.linear µs | W·xᵀ µs | × | transposed rows: as they lie µs | copied µs |\n"
        "|---|---:|---:|---:|---:|---:|---:|"
    )
    with torch.no_grad():
        for out_features, in_features in SHAPES:
            weight = torch.randn(out_features, in_features)
            for rows in ROWS:
                x = torch.randn(rows, in_features)
                before = microseconds(F.linear, x, weight)
                after = microseconds(weight_first_linear, x, weight)
                lying = torch.randn(in_features, rows).t()
                as_they_lie = microseconds(torch.mm, weight, lying.t())
                copied = microseconds(weight_first_linear, lying, weight)
                shape = f"{out_features} x {in_features}"
                print(
                    f"| {shape} | {rows} | {before:.0f} | {after:.0f} | {before / after:.2f} | {as_they_lie:.0f} | "
                    f"{copied:.0f} |"
                )
        seconds = time_layouts([(out_features, in_features, False) for out_features, in_features in SHAPES])
    chosen = WEIGHT_FIRST if seconds[WEIGHT_FIRST] < seconds[TORCH] else TORCH
    print(
        f"\nNAT_LINEAR_LAYOUT=auto's pass over these shapes: W·xᵀ {1e3 * seconds[WEIGHT_FIRST]:.3f} ms, F.linear "
        f"{1e3 * seconds[TORCH]:.3f} ms: {chosen}"
    )


if __name__ == "__main__":
    main()
