"""Which remediation actions a recovery agent believes: signed, for its topic, fresh, new.

`ActionGate.admit(topic, payload, now_ns)` returns the `ActionDoc` to act on, or None with the
reason counted in ``counters`` (and kept in ``last_reason`` for the log line):

- with verify keys (`contract.keys` ``ed25519-public``): the action must carry a valid
  signature of one of them (`contract.actionsig.verify_action`: ``unsigned``,
  ``unknown_key``, ``bad_signature``); without keys every well-formed action is believed (the
  agent was not configured for signed actions; `unverified` counts them);
- ``malformed``: not an action; ``wrong_topic``: the action's NIC or link is not the target of
  the topic it came on (a signed action re-published elsewhere);
- ``replayed``: an action id already admitted; ids are remembered until their action expires
  (at most ``max_remembered``, the soonest-expiring forgotten first), so a replay is refused
  for as long as the action itself would be acted on. An action past its signed
  ``expires_at_ns`` is passed on (counted ``expired``): the state machine
  (`recovery.machine`) answers it with an ``expired`` ack and does nothing else.

Pure: time is passed in, nothing is read or sent.
"""

from __future__ import annotations

import heapq
from collections import Counter

from contract.actionsig import ActionAuthError, verify_action
from contract.keys import KeySet
from contract.remediation import ActionDoc, DocumentError, action_topic


class ActionGate:
    """Admits the actions an agent may act on (see the module docstring)."""

    def __init__(self, keys: KeySet | None, prefix: str = "qpmesh/v1",
                 max_remembered: int = 100_000) -> None:  # fmt: skip
        self.keys = keys
        self.prefix = prefix
        self.max_remembered = max_remembered
        self.counters: Counter[str] = Counter()
        self.last_reason = ""
        self._seen: dict[str, int] = {}  # id -> expires_at_ns
        self._expiry: list[tuple[int, str]] = []

    @property
    def verifying(self) -> bool:
        """Return True when only signed actions are admitted."""
        return self.keys is not None

    def _refuse(self, reason: str, detail: str) -> None:
        self.counters[reason] += 1
        self.last_reason = f"{reason}: {detail}"

    def _forget(self, now_ns: int) -> None:
        while self._expiry and (
            self._expiry[0][0] <= now_ns or len(self._seen) > self.max_remembered
        ):
            exp, aid = heapq.heappop(self._expiry)
            if self._seen.get(aid) == exp:
                del self._seen[aid]

    def admit(self, topic: str, payload: bytes | bytearray, now_ns: int) -> ActionDoc | None:
        """Return the action in ``payload`` (received on ``topic`` at ``now_ns``) if the agent
        may act on it, else None (the reason counted). Never raises on bad input."""
        try:
            doc = (
                verify_action(payload, self.keys)
                if self.keys is not None
                else ActionDoc.decode(payload)
            )
        except ActionAuthError as exc:
            self._refuse(exc.reason, str(exc))
            return None
        except DocumentError as exc:
            self._refuse("malformed", str(exc))
            return None
        if topic != action_topic(self.prefix, doc.target):
            self._refuse("wrong_topic", f"{doc.id} for {doc.target} came on {topic}")
            return None
        self._forget(now_ns)
        if doc.id in self._seen:
            self._refuse("replayed", f"{doc.id} was already received")
            return None
        if doc.expired(now_ns):
            self.counters["expired"] += 1  # the machine acks it as expired and does nothing
        else:
            self._seen[doc.id] = doc.expires_at_ns
            heapq.heappush(self._expiry, (doc.expires_at_ns, doc.id))
            self._forget(now_ns)
        self.counters["admitted" if self.keys is not None else "unverified"] += 1
        return doc
