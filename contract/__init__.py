"""The wire and file contract of qpmesh: what probers, controllers and tools agree on.

Pure values and checks, importing nothing of qpmesh (numpy only), so every other package may
import it and it imports none of them:

- `contract.topics`: the MQTT topic layout (``<prefix>/probes|presence|health|paths/<host>``,
  ``<prefix>/events/<kind>``);
- `contract.records`: the binary probe batch (``QPMB``) a prober publishes on ``probes/<host>``;
- `contract.documents`: the JSON documents on the other topics (presence, health, discovered
  paths, events), frozen and validated, built on `contract.jsondoc`;
- `contract.neighbors`: a prober's NICs and their LLDP neighbours (``neighbors/<host>``,
  retained), what the controller learns the fabric from;
- `contract.tomlcheck`: the one validator of qpmesh's TOML files (prober, controller, scenario);
- `contract.interrupt`: the command line's part: a long ``--json`` command stopped by SIGTERM
  or SIGINT still prints its JSON, with ``"interrupted": true`` (exit 130); the one place
  that handles those signals for such commands (a thin shell, like `contract.keys`' read).

A new family of documents (remediation requests, job state, ...) gets a module of its own
beside `contract.documents`, built on `contract.jsondoc` and raising `DocumentError`.
"""
