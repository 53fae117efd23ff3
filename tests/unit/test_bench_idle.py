"""The bench's idle phase: the stack's cores with no mail, the sandbox and the bench left out,
and a phase that runs alone."""

from __future__ import annotations

from bench import phases
from bench.phases import idle
from bench.sampler import SYSTEM


def test_idle_cores_count_the_stack_and_leave_out_the_sandbox_and_the_bench() -> None:
    """Services, Cassandra and RabbitMQ count; the sandbox, the bench and the machine do not."""
    usage = {
        "api": {"cpu_s": 0.6},
        "cassandra": {"cpu_s": 1.2},
        "rabbitmq": {"cpu_s": 0.6},
        "sandbox": {"cpu_s": 3.0},
        "bench": {"cpu_s": 3.0},
        SYSTEM: {"cpu_s": 30.0},
    }

    cores, per_process = idle.stack_cores(usage, 60.0)

    assert cores == 0.04
    assert per_process == {"api": 0.01, "cassandra": 0.02, "rabbitmq": 0.01}


def test_the_idle_phase_runs_alone() -> None:
    """``--phases idle`` plans the idle phase and nothing else."""
    assert [p.name for p in phases.plan(phases.load(), ["idle"])] == ["idle"]
