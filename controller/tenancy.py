"""Which NICs belong to which tenant, as the operator granted them (pure).

A tenant owns NICs because the operator says so (``[api.tenants]`` in the controller's
config: ``acme = ["host0", "nic9"]``, a host standing for all of its NICs), never because
of what its jobs declare. `Grants.build(table, fabric)` checks the table against the fabric
and returns the grants; `Grants.nics_of(tenant)` is what a tenant may see and run jobs on
(`controller.api.views.tenant_scope`); `Grants.owner` answers for one NIC. A NIC granted to
nobody belongs to the operator alone: `Grants.may_use(tenant, nic)` (what
`controller.jobs.JobRegistry` asks of every job) lets a tenant that holds grants use only
its own NICs, and the operator's jobs (any other tenant name, ``default`` included) only the
NICs granted to nobody. With no grants at all every job may use every NIC.

Errors are `TenancyError` (a ValueError) with one line naming the tenant and the id.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from mesh.fabric import Fabric

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""A tenant name: what a token file and a job's tenant may say (no ``:``, which separates a
tenant's job ids from their names, see `controller.jobs.Job`)."""


class TenancyError(ValueError):
    """A bad grant: an unknown tenant name, NIC or host, or a NIC granted twice."""


@dataclass(frozen=True)
class Grants:
    """NIC id -> the tenant it is granted to (NICs of nobody are absent)."""

    owner_of: Mapping[str, str] = field(default_factory=dict)
    _by_tenant: Mapping[str, frozenset[str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by: dict[str, set[str]] = {}
        for nic, tenant in self.owner_of.items():
            if not NAME.match(tenant):
                raise TenancyError(f"bad tenant name {tenant!r} (for {nic})")
            by.setdefault(tenant, set()).add(nic)
        object.__setattr__(self, "_by_tenant", {t: frozenset(v) for t, v in by.items()})

    @classmethod
    def build(cls, table: Mapping[str, Iterable[str]], fabric: Fabric) -> Grants:
        """Return the grants of ``table`` (tenant -> NIC and host ids of ``fabric``); raise
        `TenancyError` for a bad tenant name, an id the fabric lacks, or a NIC granted to two
        tenants (or twice to one)."""
        hosts: dict[str, list[str]] = {}
        for n in fabric.nics:
            hosts.setdefault(n.host, []).append(n.id)
        owner: dict[str, str] = {}
        for tenant, ids in table.items():
            if not NAME.match(tenant):
                raise TenancyError(f"bad tenant name {tenant!r}: want 1-64 of [A-Za-z0-9_.-]")
            for ident in ids:
                if ident in fabric.nic_index:
                    nics = [ident]
                elif ident in hosts:
                    nics = hosts[ident]
                else:
                    raise TenancyError(f"tenant {tenant}: no NIC or host {ident!r} in the fabric")
                for nic in nics:
                    if nic in owner:
                        raise TenancyError(
                            f"tenant {tenant}: {nic} is already granted to {owner[nic]}"
                        )
                    owner[nic] = tenant
        return cls(owner)

    def owner(self, nic: str) -> str | None:
        """Return the tenant ``nic`` is granted to, None if nobody's."""
        return self.owner_of.get(nic)

    def may_use(self, tenant: str, nic: str) -> bool:
        """Return True if a job of ``tenant`` may run on ``nic``: a NIC granted to a tenant
        is that tenant's alone; a NIC granted to nobody is for the jobs of tenants holding no
        grant (the operator's)."""
        owner = self.owner_of.get(nic)
        return owner == tenant if owner is not None else tenant not in self._by_tenant

    def nics_of(self, tenant: str) -> frozenset[str]:
        """Return the NIC ids granted to ``tenant`` (empty for a tenant with none)."""
        return self._by_tenant.get(tenant, frozenset())

    def tenants(self) -> frozenset[str]:
        """Return the tenants holding at least one NIC."""
        return frozenset(self._by_tenant)
