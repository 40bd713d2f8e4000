#!/usr/bin/env bash
# The README's main job: a 2-worker DDP TrainingJob run locally (`kubetrain run --local`) on a real
# CIFAR-10 sample shipped in examples/data, then `kubetrain predict` on held-out images.
# Leaves the model, metrics.json and the PNGs in runs/demo/output/cifar10-cpu/.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
demo=runs/demo
rm -rf "$demo"
# The volumes live under --workdir ($demo/data, $demo/output); local mode extracts the committed sample
# into the data volume's directory itself, as it does for `kubetrain run` without flags.
echo "== training: kubetrain run -f examples/cifar10-cpu.yaml --local --workdir $demo"
"$bin/kubetrain" run -f examples/cifar10-cpu.yaml --local --workdir "$demo"
artifacts="$demo/output/cifar10-cpu"
echo "== predicting held-out images never seen in training"
"$bin/kubetrain" predict "$artifacts/model.pt" examples/data/predict/{airplane,cat,ship,truck}/4999.jpg
echo "== artifacts in $artifacts:"
ls -1 "$artifacts"
