"""``make hostile``: what a hostile user's input costs each parser and each service.

Part (a), in-process: every parser that takes a user's or a provider's input, on the input
that costs it most, at 1x and 10x in the same run, each in a child process with a timeout;
the figure is the ratio of the two times (target: at most 15). Part (b), against a running
stack (:class:`bench.stack.Stack`, as ``make bench`` starts it, with the sandbox
providers): the hostile inputs of issue 33 and those of ``make fuzz``, then each service's
longest event-loop stall and peak RSS from its ``/metrics`` (``shared.infra.stall_monitor``;
targets: 100 ms, and each service's configured memory limit,
:func:`bench.hostile.targets.rss_limits`).

Modules: :mod:`bench.hostile.run` (entry point), :mod:`bench.hostile.cases` (the parser
table), :mod:`bench.hostile.measure` (the child that times one case) and
:mod:`bench.hostile.parsers` (runs them), :mod:`bench.hostile.payloads` (the hostile
requests, pure), :mod:`bench.hostile.attack` and :mod:`bench.hostile.fuzzed` (send them),
:mod:`bench.hostile.scrape` (reads the figures), :mod:`bench.hostile.targets` (the
verdicts, pure), :mod:`bench.hostile.report` (table, JSON and the summary line).
"""
