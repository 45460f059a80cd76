#!/usr/bin/env bash
# README's first comparison: ddp, diloco and streaming-diloco on three WAN presets, 4 nodes,
# and the figures README and the documentation show, copied from the sweep's folder into
# docs/figures/. About a minute on a 2-core machine. Run from anywhere: bash examples/compare.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
exoframe sweep --strategy ddp,diloco,streaming-diloco --net wan-10mbps,wan-100mbps,wan-1gbps --nodes 4 --out "$out"
sweep=$(echo "$out"/*-sweep)
cp "$sweep/val_loss_wan-10mbps.png" docs/figures/compare-val-loss-wan-10mbps.png
cp "$sweep/time_vs_bandwidth.png" docs/figures/compare-time-vs-bandwidth.png
echo "figures: docs/figures/compare-val-loss-wan-10mbps.png docs/figures/compare-time-vs-bandwidth.png"
