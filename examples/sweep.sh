#!/usr/bin/env bash
# Below what bandwidth does DiLoCo beat DDP on this model, and what compute utilization
# does each get? Two training runs, replayed through 8 WAN bandwidths; the table, CSV, JSON
# and plots land in sweeps/<timestamp>-sweep/.
set -euo pipefail
exoframe sweep --strategy ddp,diloco -p diloco.H=50 --nodes 4 --steps 300 \
    --net wan-100mbps --bandwidth 10mbit..10gbit --points 8 \
    --compute fixed:100ms --target-loss 1.85

# The same question for a 1B-parameter model whose step computes for 0.5 s on each node:
exoframe sweep --strategy ddp,diloco -p diloco.H=50 --nodes 4 --steps 300 \
    --net wan-100mbps --bandwidth 100mbit..100gbit --points 8 \
    --compute fixed:100ms --project-params 1e9 --step-time 0.5s
