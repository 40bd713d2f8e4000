"""`make node-images` pushes the images it built into the test cluster's registry storage, with no cluster
running: a registry of that storage on a loopback port takes the push, then stops. The cluster's registry
serves the same storage, so its node finds the images there. A build is pushed once: podman 4.3 would
compress the trainer's 6 GB again on every push."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from testcluster import registry
from testcluster.node import build_images

pytestmark = [pytest.mark.e2e, pytest.mark.binaries]


def test_node_images_pushes_both_builds_into_the_registry_storage_once_and_stops_its_registry(
    tmp_path: Path,
) -> None:
    references = build_images()
    assert [reference.split(":")[0].rsplit("/", 1)[1] for reference in references] == [
        "kubetrain-operator",
        "kubetrain-trainer",
    ]
    for reference in references:  # forget earlier pushes of these builds: this push must send them
        (registry.PUSHED / registry.image_id(reference)).unlink(missing_ok=True)

    digests = registry.push_to_storage(references, tmp_path / "first")

    assert set(digests) == set(references)
    for reference, digest in digests.items():
        assert digest.startswith("sha256:"), digest
        assert registry.stored_digest(reference) == digest
    config = (tmp_path / "first" / "config.yml").read_text()
    port = int(config.split("addr: 127.0.0.1:")[1].split()[0])
    with socket.socket() as probe:  # the push's registry is gone: nothing listens on its port any more
        assert probe.connect_ex(("127.0.0.1", port)) != 0

    # The same builds again: found stored, so no registry starts and nothing is pushed.
    assert registry.push_to_storage(references, tmp_path / "again") == digests
    assert not (tmp_path / "again").exists()
