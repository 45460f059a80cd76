"""Experiments: many runs, or a recorded one again. The engine (exoframe.engine) is one run;
this package sits beside it and uses it, never the other way round.

sweep.py runs a grid of runs (strategies x networks x any swept field, sweep_axes.py) and
writes its table; executors.py is where a sweep's runs happen (here, or on Ray);
run_replays.py replays a run folder's trace through other networks (and projects it to a
larger model) without training again; trace_events.py makes a recorded run's timeline in
Trace Event Format."""
