"""svgen's benchmarks: each compares svgen with the stock alternative in the same run (ratios, not absolute times;
accuracy with paired bootstrap intervals) and writes its results to ``bench-results/``.

Run one from the repository root as a module, e.g. ``python -m benchmarks.bench_adapt --help``; ``bench_common``
holds what they share: the data, the paired bootstrap, timing, results and tables. They are not part of the
installed package.
"""
