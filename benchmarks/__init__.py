"""Benchmarks: hpctorch against torchrun and against itself at scale. Not part of the tests."""
