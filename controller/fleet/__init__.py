"""The sharded controller: ingest workers and one solver on NATS JetStream (docs/scale.md).

The pure core (`worker`, `solver`) and the shell around it on NATS: `plane` (names, sizes,
the fleet-wide window grid), `partials` (partials on the wire: chunks and the commit that makes
one build count), `book` (which windows the solver may solve, late partials), `cores` (what
the shells need of the core), `workerloop` (``qpmesh controller worker``), `solverloop`
(the solver's lease, partial reader and solves, inside ``qpmesh controller`` with ``[fleet]``).
"""
