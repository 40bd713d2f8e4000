"""What this operator lets a TrainingJob ask for: the cluster admin's narrowing of the trust model. Pure.

Whoever may create a TrainingJob in a watched namespace makes the operator create pods there with the
operator's own rights, so the spec fields that reach beyond the namespace's usual limits are the ones
to narrow: `spec.storage[].hostPath` (a node's file system) and `spec.serviceAccountName` (any identity
of the namespace, with whatever RBAC it holds). Two operator flags narrow them; by default everything
the API allows is allowed. A job refused here fails before anything is created, or, when it already
runs (the flags changed under it), is held: the planner's step 1 decides which.
"""

from __future__ import annotations

import dataclasses

from kubetrain_operator import api

VOLUME_TYPES = ("persistentVolumeClaim", "hostPath", "emptyDir")
"""The volume sources `spec.storage[]` can name, spelled as in the spec (and in --allowed-volume-types)."""


@dataclasses.dataclass(frozen=True)
class Policy:
    volume_types: frozenset[str] | None = None
    """`spec.storage[]` sources allowed (--allowed-volume-types); None allows every one of VOLUME_TYPES."""
    service_accounts: frozenset[str] | None = None
    """`spec.serviceAccountName` values allowed (--allowed-service-accounts); None allows any. A job that
    names none always passes: it runs as the operator's --worker-service-account, which the admin chose,
    or as the namespace's default account."""


def _volume_type(volume: api.StorageVolume) -> str:
    if volume.persistent_volume_claim is not None:
        return "persistentVolumeClaim"
    return "hostPath" if volume.host_path is not None else "emptyDir"


def _listed(values: frozenset[str]) -> str:
    return ",".join(sorted(values)) or "(empty)"


def refusal(spec: api.TrainingJobSpec, policy: Policy) -> str | None:
    """Why this operator does not run `spec` (naming the field and the flag), or None when it may."""
    if policy.volume_types is not None:
        for index, volume in enumerate(spec.storage or ()):
            kind = _volume_type(volume)
            if kind not in policy.volume_types:
                return (
                    f"spec.storage[{index}].{kind} is not allowed by this operator "
                    f"(--allowed-volume-types={_listed(policy.volume_types)})"
                )
    account = spec.service_account_name
    if account and policy.service_accounts is not None and account not in policy.service_accounts:
        return (
            f"spec.serviceAccountName {account!r} is not allowed by this operator "
            f"(--allowed-service-accounts={_listed(policy.service_accounts)})"
        )
    return None
