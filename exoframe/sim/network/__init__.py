"""The network model: links and sites (topology.py), flows sharing links by max-min
(flows.py), TCP's ramp (tcp.py), collectives as plans of flows, network files and presets,
failures, and the units they are written in."""
