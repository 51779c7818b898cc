"""GroupedLinear forms on this CPU: baddbmm vs one GEMM per member vs one dense Linear of equal FLOPs.

    python benchmarks/grouped_linear.py

Prints median milliseconds and the ratio to the dense Linear (the same FLOPs in one call), for the
shapes of a vit_tiny Hydra at batch 64 (3 members, 197 tokens, width 192).
"""

from __future__ import annotations

import statistics
import time

import torch


def median_ms(fn, repeats: int = 9) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


@torch.no_grad()
def measure(m: int, n: int, k: int, o: int) -> tuple[float, float, float]:
    """Median ms of: one dense Linear with M*o outputs, baddbmm over M, M addmm calls into one buffer."""
    x, w, b = torch.randn(m, n, k), torch.randn(m, k, o), torch.randn(m, 1, o)
    x1, w1, b1 = torch.randn(n, k), torch.randn(m * o, k), torch.randn(m * o)
    out = torch.empty(m, n, o)
    dense = median_ms(lambda: torch.nn.functional.linear(x1, w1, b1))
    bmm = median_ms(lambda: torch.baddbmm(b, x, w))
    loop = median_ms(lambda: [torch.addmm(b[i], x[i], w[i], out=out[i]) for i in range(m)])
    return dense, bmm, loop


def main() -> None:
    m, n = 3, 64 * 197
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print("| layer | in x out per member | dense Linear ms | baddbmm ms | x dense | per-member GEMMs ms | x dense |")
    print("|---|---|---|---|---|---|---|")
    for name, k, o in (("qkv (1/3 heads)", 192, 192), ("mlp fc1 (1/3 width)", 192, 256), ("mlp fc2", 256, 192)):
        dense, bmm, loop = measure(m, n, k, o)
        print(f"| {name} | {k} x {o} | {dense:.1f} | {bmm:.1f} | {bmm / dense:.2f} | {loop:.1f} | {loop / dense:.2f} |")


if __name__ == "__main__":
    main()
