"""Build examples/data/ (a small real CIFAR-10 sample) from the shared 50,000-image archive, reproducibly.

Output:
- examples/data/cifar10-sample.tar.gz: `cifar10-sample/train/<class>/NNNN.jpg`, the first `--per-class`
  images of every class (an ImageFolder tree; `kubetrain train --dataset imagefolder`);
- examples/data/predict/<class>/NNNN.jpg: the last `--holdout` images of every class, never in the
  tarball, for `kubetrain predict` demos.
The JPEG bytes are copied unchanged and the tarball has fixed metadata, so reruns produce identical files.

    python benchmarks/trainer_make_sample.py --source ../shared/datasets/cifar10-train.tar.gz
"""

from __future__ import annotations

import argparse
import gzip
import io
import re
import tarfile
from collections import defaultdict
from pathlib import Path

_MEMBER = re.compile(r"^(?:\./)?train/([^/]+)/(\d+)\.jpg$")


def read_archive(source: Path) -> dict[str, dict[str, bytes]]:
    """class -> {file name -> JPEG bytes} for every image in the source archive."""
    images: dict[str, dict[str, bytes]] = defaultdict(dict)
    with tarfile.open(source, "r:gz") as archive:
        for member in archive:
            match = _MEMBER.match(member.name)
            if member.isfile() and match:
                handle = archive.extractfile(member)
                assert handle is not None
                images[match.group(1)][f"{match.group(2)}.jpg"] = handle.read()
    return images


def write_tarball(path: Path, files: dict[str, bytes]) -> None:
    """A gzip'd tar with sorted members and zeroed times/owners: byte-identical across runs."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size = len(files[name])
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(files[name]))
    with path.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as zipped:
        zipped.write(buffer.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--source", type=Path, default=Path("../shared/datasets/cifar10-train.tar.gz"))
    parser.add_argument("--out", type=Path, default=Path("examples/data"))
    parser.add_argument("--per-class", type=int, default=300)
    parser.add_argument("--holdout", type=int, default=20)
    args = parser.parse_args()

    images = read_archive(args.source)
    train: dict[str, bytes] = {}
    args.out.mkdir(parents=True, exist_ok=True)
    for cls in sorted(images):
        names = sorted(images[cls])
        for name in names[: args.per_class]:
            train[f"cifar10-sample/train/{cls}/{name}"] = images[cls][name]
        held = args.out / "predict" / cls
        held.mkdir(parents=True, exist_ok=True)
        for name in names[len(names) - args.holdout :]:
            (held / name).write_bytes(images[cls][name])
    write_tarball(args.out / "cifar10-sample.tar.gz", train)
    print(
        f"wrote {len(train)} training images to {args.out / 'cifar10-sample.tar.gz'} and "
        f"{args.holdout} per class to {args.out / 'predict'}"
    )


if __name__ == "__main__":
    main()
