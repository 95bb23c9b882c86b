"""The ``[remediation]`` table of the controller config -> a frozen `RemediationConfig`.

::

    [remediation]
    control = false            # Control's state at start (false: actions are "would have")
    hold_s = 1.0               # move_off_nic: the NIC stayed bad this long (a flap acts at once)
    move_back_hold_s = 60.0    # may_move_back: the NIC stayed clear this long
    replace_count = 10         # replace_link: this many downs of one link ...
    replace_window_s = 3600.0  # ... within this window
    ttl_s = 120.0              # an action expires this long after it is issued
    min_interval_s = 30.0      # one action per (kind, target, job) per this interval
    max_actions = 20           # at most this many actions ...
    budget_window_s = 60.0     # ... per this window, overall
    state_dir = "state"        # optional: remember sent actions across restarts
    webhooks = ["http://..."]  # optional: POST every action as JSON
    webhook_timeout_s = 5.0
    webhook_retries = 5
    alertmanager = "http://alertmanager:9093"  # optional: findings as v2 alerts

and the key that signs the actions, in the config's ``[auth]`` table::

    [auth]
    action_key_file = "action.key"  # ed25519-private, mode 0600 (docs/security.md)

Read through `contract.tomlcheck` (strict types, unknown keys are errors). `read_remediation`
returns the defaults for no table (the policy with its defaults, Control off: "would have")
and raises the table's error class (one line naming the file and the key); it does no I/O
(``state_dir`` is only resolved). `read_action_key_file` returns the key file's path and
`load_action_keys` reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from contract.keys import ED25519_PRIVATE, KeyFileError, KeySet, load_key_file
from contract.tomlcheck import Table
from controller.remediation.policy import SEC, PolicyConfig, PolicyError, Rule


def is_http_url(url: str) -> bool:
    """Return True for an ``http(s)://HOST[:PORT][/path]`` URL."""
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


@dataclass(frozen=True)
class RemediationConfig:
    """The policy, Control's initial state, where sent actions are remembered, who hears."""

    policy: PolicyConfig = field(default_factory=PolicyConfig)
    control: bool = False
    state_dir: Path | None = None
    webhooks: tuple[str, ...] = ()
    webhook_timeout_s: float = 5.0
    webhook_retries: int = 5
    alertmanager: str = ""


def _ns(seconds: float) -> int:
    return round(seconds * SEC)


def read_remediation(tab: Table, base_dir: Path | None = None) -> RemediationConfig:
    """Return the ``[remediation]`` settings (the defaults when the table is absent or
    empty); relative ``state_dir`` is taken from ``base_dir``. Raises the table's error."""
    if not tab.values:
        tab.finish()
        return RemediationConfig()
    pos, nonneg = "a number > 0", "a number >= 0"
    d = PolicyConfig()
    hold = tab.get("hold_s", float, 1.0, lambda v: v >= 0, nonneg)
    back = tab.get("move_back_hold_s", float, 60.0, lambda v: v >= 0, nonneg)
    count = tab.get("replace_count", int, 10, lambda v: v >= 1, "an integer >= 1")
    window = tab.get("replace_window_s", float, 3600.0, lambda v: v > 0, pos)
    down = ("nic_down", "link_down", "link_flap")
    rules = (
        Rule(down, "move_off_nic", hold_ns=_ns(hold)),
        Rule(down, "replace_link", min_count=count, window_ns=_ns(window)),
        Rule(("contention",), "report_contention"),
        Rule(("clear",), "may_move_back", hold_ns=_ns(back)),
    )
    try:
        policy = PolicyConfig(
            rules=rules,
            ttl_ns=_ns(tab.get("ttl_s", float, d.ttl_ns / SEC, lambda v: v > 0, pos)),
            min_interval_ns=_ns(
                tab.get("min_interval_s", float, d.min_interval_ns / SEC, lambda v: v >= 0, nonneg)
            ),
            max_actions=tab.get(
                "max_actions", int, d.max_actions, lambda v: v >= 1, "an integer >= 1"
            ),
            budget_window_ns=_ns(
                tab.get("budget_window_s", float, d.budget_window_ns / SEC, lambda v: v > 0, pos)
            ),
        )
    except PolicyError as exc:
        raise tab.err("ttl_s", str(exc)) from None
    control = tab.get("control", bool, False)
    state_dir = None
    raw_dir = tab.get("state_dir", str, "", bool, "a directory name")
    if raw_dir:
        state_dir = Path(raw_dir)
        if not state_dir.is_absolute() and base_dir is not None:
            state_dir = base_dir / state_dir
    hooks: list[str] = []
    raw_hooks = tab.get("webhooks", list, [])
    for i, url in enumerate(raw_hooks):
        if not (isinstance(url, str) and is_http_url(url)):
            raise tab.err(f"webhooks[{i}]", f"must be an http(s) URL, got {url!r}")
        hooks.append(url)
    timeout = tab.get("webhook_timeout_s", float, 5.0, lambda v: v > 0, pos)
    retries = tab.get("webhook_retries", int, 5, lambda v: v >= 0, "an integer >= 0")
    am = tab.get("alertmanager", str, "", is_http_url, "an http(s)://HOST[:PORT] URL")
    tab.finish()
    return RemediationConfig(policy, control, state_dir, tuple(hooks), timeout, retries, am)


def read_action_key_file(tab: Table, base_dir: Path | None = None) -> Path | None:
    """Return ``[auth] action_key_file`` (relative: to ``base_dir``), None when unset (the
    actions go out unsigned). Raises the table's error; the file is read by
    `load_action_keys`."""
    name = tab.get("action_key_file", str, "", bool, "a key file path")
    tab.finish()
    if not name:
        return None
    path = Path(name)
    return base_dir / path if not path.is_absolute() and base_dir is not None else path


def load_action_keys(path: Path | None, error: type[ValueError]) -> KeySet | None:
    """Return the signing key in ``path`` (an ``ed25519-private`` key file, mode 0600; its
    repr shows key ids only), None for no path. Raises ``error`` with one line naming the
    file, never the key (`contract.keys.KeyFileError`'s message)."""
    if path is None:
        return None
    try:
        return load_key_file(path, ED25519_PRIVATE)
    except KeyFileError as exc:
        raise error(str(exc)) from None
