"""Safedelivr's benchmark: raw baselines and the real pipeline measured in the same run.

``make bench`` (``python -m bench.run``) migrates a private keyspace, declares a private
exchange, runs the registered phases (raw limits first, the pipeline as a ratio of them, the
raw acceptance limit again at the end) and writes ``bench/results/<UTC timestamp>.json``.

Modules: :mod:`bench.run` (entry point), :mod:`bench.phases` (the phase registry and the
phases), :mod:`bench.stack` and :mod:`bench.services` (keyspace, topology, service
processes), :mod:`bench.raw`, :mod:`bench.loadgen` and :mod:`bench.feeder` (child processes
that make the load), :mod:`bench.child` (their line protocol), :mod:`bench.workload` (the
request body and batches), :mod:`bench.sampler`, :mod:`bench.procfs` and :mod:`bench.gclog`
(CPU, memory and GC pauses), :mod:`bench.cqlops` (Cassandra operations per batch, from
``system_views``), :mod:`bench.stats`, :mod:`bench.schedule` and
:mod:`bench.targets` (pure figures), :mod:`bench.headline` (each headline figure beside its
raw baseline; a figure its baseline makes impossible refused), :mod:`bench.report` (JSON and
table), :mod:`bench.cleanup` (leftovers of interrupted runs), :mod:`bench.experiments`
(what-ifs).

:mod:`bench.hostile` is ``make hostile``: every parser on hostile input at 1x and 10x, and
the hostile inputs of issue 33 against the same stack, judged by each service's event-loop
stalls and peak RSS.
"""
