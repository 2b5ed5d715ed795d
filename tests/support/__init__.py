"""Helpers shared by the tests and the benchmarks: corpora, running builds, reading caches
independently of tokshuf, and small pure-Python references of the tokenizers, the shuffle,
the reader's order and blends.

Tests import it as ``support`` (pytest puts ``tests/`` on ``sys.path``); benchmarks, run from
the repository root as ``python -m benches.NAME``, import it as ``tests.support``.
"""
