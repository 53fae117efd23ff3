"""Safedelivr's benchmark: raw baselines and the real pipeline measured in the same run.

``make bench`` (``python -m bench.run``) migrates a private keyspace, declares a private
exchange, runs the registered phases (raw limits first, the pipeline as a ratio of them, the
raw acceptance limit again at the end) and writes ``bench/results/<UTC timestamp>.json``.
See :mod:`bench.run` for the options and :mod:`bench.phases` for the phase registry.
"""
