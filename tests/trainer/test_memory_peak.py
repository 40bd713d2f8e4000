"""The memory check's prediction against a real process's measured peak (issue 26): within 15 %.

The check decides whether a data set is held in memory or streamed from disk, so a prediction under the
peak lets a set through that is then OOM-killed and retried (the old check, which counted the decoded set
twice and nothing else, was 51 to 73 % under these peaks), and one far over it streams sets that fit.
Each case runs `memory_peak_worker.py`: a fresh process that reads its memory as the trainer does, loads
the data as `kubetrain train` does and trains one epoch of batches, then reports its VmHWM.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.unit

WORKER = Path(__file__).with_name("memory_peak_worker.py")
TOLERANCE = 0.15


def _measure(config: dict[str, Any]) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, str(WORKER), json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("data", "augment"),
    [
        ({"dataset": "imagefolder", "image_size": 128}, True),  # decoded into the cache file, read back
        ({"dataset": "imagefolder", "image_size": 128, "cache": "memory", "cache_decoded": False}, False),
        ({"dataset": "fake", "fake_size": 3000, "image_size": 96}, True),  # through torchvision, copied
    ],
    ids=["imagefolder-cached-augment", "imagefolder-uncached", "fake-augment"],
)
def test_the_predicted_peak_is_within_15_percent_of_a_real_processs_measured_peak(
    sample_root: Path, tmp_path: Path, data: dict[str, Any], augment: bool
) -> None:
    config = {
        "model": "resnet_small",
        "augment": augment,
        "batch_size": 128,
        "data": {"root": str(sample_root), "cache_dir": str(tmp_path / "cache"), **data},
    }
    figures = _measure(config)
    error = figures["predicted"] / figures["measured"] - 1
    old_error = figures["old_predicted"] / figures["measured"] - 1
    print(
        f"predicted {figures['predicted'] >> 20} MiB, measured {figures['measured'] >> 20} MiB: {error:+.1%}"
    )
    print(f"old check {figures['old_predicted'] >> 20} MiB: {old_error:+.1%}")
    assert not figures["mapped"]
    assert abs(error) <= TOLERANCE, figures
