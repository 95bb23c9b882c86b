"""Rank registrations from MQTT into the job registry (pure apart from the registry's lock).

The recovery agent of every rank publishes a retained `contract.remediation.RankDoc` on
``<prefix>/jobs/<job>/rank<k>``; an empty retained payload withdraws it. `RankFeed.apply`
folds one such message into a `controller.jobs.JobRegistry`: the job's ranks are the
registered ranks in rank order; a job whose last rank is withdrawn is unregistered. A job id
registered by another tenant (through the API) is refused, never taken over.
"""

from __future__ import annotations

from contract.remediation import DocumentError, RankDoc, parse_rank_topic
from controller.jobs import Job, JobError, JobRegistry


class RankFeed:
    """Which rank of which job uses which NICs, as heard on MQTT."""

    def __init__(self, registry: JobRegistry, prefix: str) -> None:
        self.registry, self.prefix = registry, prefix
        self._ranks: dict[str, dict[int, RankDoc]] = {}

    def apply(self, topic: str, payload: bytes) -> str:
        """Apply one message; return ``jobs`` (applied), ``ignored`` (not a rank topic) or
        ``bad:<reason>`` (malformed, or the job id is another tenant's). Never raises."""
        where = parse_rank_topic(self.prefix, topic)
        if where is None:
            return "ignored"
        job, rank = where
        ranks = self._ranks.setdefault(job, {})
        if not payload:
            ranks.pop(rank, None)
        else:
            try:
                doc = RankDoc.decode(payload)
            except DocumentError as exc:
                return f"bad:{exc}"
            if (doc.job, doc.rank) != (job, rank):
                return f"bad:rank registration for {doc.job}/rank{doc.rank} on {topic}"
            ranks[rank] = doc
        try:
            if not ranks:
                self._ranks.pop(job, None)
                if self.registry.get(job) is not None:
                    self.registry.unregister(job)
                return "jobs"
            docs = [ranks[k] for k in sorted(ranks)]
            self.registry.put(Job(job, docs[0].tenant, tuple(d.nics for d in docs)))
        except JobError as exc:
            ranks.pop(rank, None)
            return f"bad:{exc}"
        return "jobs"
