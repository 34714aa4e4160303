"""Time a linear layer's product both ways on this CPU, cold cache (docs/results.md, modules/cpu_linear.py):
torch's F.linear (x·Wᵀ) against W·xᵀ as WeightFirstLinear computes it, for the teacher's layer shapes and row counts.

    python dev/bench_linear_layout.py [--threads 2] [--repeats 200]
"""

import argparse
import time

import torch
import torch.nn.functional as F

from nat_plugins.modules.cpu_linear import WeightFirstLinear

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
            layer = WeightFirstLinear(in_features, out_features, bias=False)
            for rows in ROWS:
                x = torch.randn(rows, in_features)
                before = microseconds(F.linear, x, layer.weight)
                after = microseconds(layer, x)
                lying = torch.randn(in_features, rows).t()
                as_they_lie = microseconds(torch.mm, layer.weight, lying.t())
                copied = microseconds(layer, lying)
                shape = f"{out_features} x {in_features}"
                print(
                    f"| {shape} | {rows} | {before:.0f} | {after:.0f} | {before / after:.2f} | {as_they_lie:.0f} | "
                    f"{copied:.0f} |"
                )


if __name__ == "__main__":
    main()
