"""The storage volumes mounted into every worker (a PersistentVolumeClaim, hostPath or emptyDir each) and
the spelling rules for their paths: one spelling per directory, no escape from a volume.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from kubetrain_operator.api import base, quantities


def is_clean_mount_path(path: str) -> bool:
    """An absolute path in its one spelling: no trailing /, no empty, . or .. parts, and not / itself.
    Two spellings of one directory (/data and /data/, /output/../data) would mount twice on one place."""
    return path.startswith("/") and all(part not in ("", ".", "..") for part in path[1:].split("/"))


def is_descending_path(path: str) -> bool:
    """A relative path that stays below where it starts (a subPath): not absolute, no .. part."""
    return not path.startswith("/") and ".." not in path.split("/")


_CLEAN_MOUNT_PATH_RULE = base.cel_rule(
    "self.startsWith('/') && self != '/' && !self.endsWith('/') && !self.contains('//') "
    "&& !(self + '/').contains('/./') && !(self + '/').contains('/../')",
    "mountPath must be an absolute path other than / with no trailing /, no // and no . or .. parts, "
    "e.g. /data",
)
_DESCENDING_PATH_RULE = base.cel_rule(
    "!self.startsWith('/') && !('/' + self + '/').contains('/../')",
    "subPath must be a relative path inside the volume: no leading / and no .. parts, e.g. cifar10/train",
)
_HOST_PATH_RULE = base.cel_rule(
    "self.startsWith('/') && !(self + '/').contains('/../')",
    "path must be an absolute path on the node with no .. parts, e.g. /mnt/datasets",
)


class PVCSource(base.Model):
    claim_name: str = Field(
        ...,
        min_length=1,
        max_length=253,
        pattern=base.DNS_SUBDOMAIN_PATTERN,
        description=(
            "claimName is the name of a PersistentVolumeClaim in the TrainingJob's namespace (a DNS "
            "subdomain: lower-case letters, digits, - and .)."
        ),
    )
    read_only: bool = Field(False, description="readOnly mounts the claim read-only. Default false.")


class HostPathSource(base.Model):
    path: str = Field(
        ...,
        min_length=1,
        max_length=4096,
        description=(
            "path is the directory on the node, an absolute path without .. parts. hostPath volumes break "
            "the restricted Pod Security Standard: use them only on development clusters."
        ),
        json_schema_extra=base.schema_extra(_HOST_PATH_RULE),
    )

    @field_validator("path")
    @classmethod
    def _absolute(cls, path: str) -> str:
        if not path.startswith("/") or ".." in path.split("/"):
            raise ValueError(_HOST_PATH_RULE["message"])
        return path

    type: Literal["", "Directory", "DirectoryOrCreate"] = Field(
        "DirectoryOrCreate",
        description=(
            "type is the hostPath type check: Directory, DirectoryOrCreate or empty. Default "
            "DirectoryOrCreate."
        ),
    )


class EmptyDirSource(base.Model):
    medium: Literal["", "Memory"] = Field(
        "", description="medium is the storage medium: empty (node disk, default) or Memory (tmpfs)."
    )
    size_limit: quantities.Quantity | None = Field(
        None,
        description="sizeLimit caps the volume's size in quantity syntax (e.g. 10Gi). Default: no limit.",
    )


class StorageVolume(base.Model):
    """One volume mounted into every worker for data, checkpoints and artifacts."""

    model_config = ConfigDict(
        json_schema_extra=base.schema_extra(
            base.cel_rule(
                "[has(self.persistentVolumeClaim), has(self.hostPath), has(self.emptyDir)]"
                ".filter(x, x).size() == 1",
                "exactly one of persistentVolumeClaim, hostPath and emptyDir must be set",
            )
        )
    )

    name: str = Field(
        ...,
        min_length=1,
        max_length=40,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description=(
            "name identifies the volume (a DNS label of at most 40 characters); the pod volume is named "
            "`data-<name>`. Required, unique within storage."
        ),
    )
    mount_path: str = Field(
        ...,
        min_length=1,
        max_length=4096,
        description=(
            "mountPath is the absolute path where the volume appears in the worker container, written "
            "once (no trailing /, no . or .. parts, not / itself) and unique within storage. /dev/shm "
            "replaces the memory-backed /dev/shm the operator mounts otherwise. Required."
        ),
        json_schema_extra=base.schema_extra(_CLEAN_MOUNT_PATH_RULE),
    )
    sub_path: str | None = Field(
        None,
        max_length=4096,
        description=(
            "subPath mounts only this sub-directory of the volume: a relative path without .. parts. "
            "Default: the root."
        ),
        json_schema_extra=base.schema_extra(_DESCENDING_PATH_RULE),
    )
    persistent_volume_claim: PVCSource | None = Field(
        None, description="persistentVolumeClaim mounts an existing claim (ReadWriteMany when workers > 1)."
    )
    host_path: HostPathSource | None = Field(None, description="hostPath mounts a directory of the node.")
    empty_dir: EmptyDirSource | None = Field(
        None, description="emptyDir is scratch space that lives as long as the worker pod."
    )

    @field_validator("mount_path")
    @classmethod
    def _clean_mount_path(cls, path: str) -> str:
        if not is_clean_mount_path(path):
            raise ValueError(_CLEAN_MOUNT_PATH_RULE["message"])
        return path

    @field_validator("sub_path")
    @classmethod
    def _descending_sub_path(cls, path: str | None) -> str | None:
        if path is not None and not is_descending_path(path):
            raise ValueError(_DESCENDING_PATH_RULE["message"])
        return path

    @model_validator(mode="after")
    def _one_source(self) -> StorageVolume:
        given = [s for s in (self.persistent_volume_claim, self.host_path, self.empty_dir) if s is not None]
        if len(given) != 1:
            raise ValueError("exactly one of persistentVolumeClaim, hostPath and emptyDir must be set")
        return self
