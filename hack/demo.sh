#!/usr/bin/env bash
# The README's main job: a 2-worker DDP TrainingJob run locally (`kubetrain run --local`) on a real
# CIFAR-10 sample shipped in examples/data, then `kubetrain predict` on held-out images.
# Leaves the model, metrics.json and the PNGs in runs/demo/output/cifar10-cpu/.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
demo=runs/demo
rm -rf "$demo"
mkdir -p "$demo/data"
tar xzf examples/data/cifar10-sample.tar.gz -C "$demo/data"
echo "== training: kubetrain run -f examples/cifar10-cpu.yaml --local"
"$bin/kubetrain" run -f examples/cifar10-cpu.yaml --local --mount data="$demo/data" --mount output="$demo/output"
artifacts="$demo/output/cifar10-cpu"
echo "== predicting held-out images never seen in training"
"$bin/kubetrain" predict "$artifacts/model.pt" examples/data/predict/{airplane,cat,ship,truck}/4999.jpg
echo "== artifacts in $artifacts:"
ls -1 "$artifacts"
