"""Benchmarks, each a module run from the repository root: ``python -m bench.<name> [--help]``.

- ``resilience_overhead``: what the resilience layers cost per call (``make bench``);
- ``a2a_overhead``: one A2A call against a plain JSON POST;
- ``checkpoint_saver``: a graph run with LangGraph's Postgres saver against ours;
- ``booking_throughput``: bookings per second and latency of a real stack, priced against baselines;
- ``latency_breakdown``: where one booking's time goes, from its trace;
- ``ab_stacks``: two stacks under the same load at once, CPU per booking in each service;
- ``layer_costs``: what each layer around the saga costs a booking;
- ``recovery_time``: how long a booking takes to finish after its booking-agent dies.

Processes, ports, readiness and stacks come from the test harness (``tests.procs``, ``tests.stack``); ``_stack``
adds what only the benches need. Results go to ``bench/results/``.
"""
