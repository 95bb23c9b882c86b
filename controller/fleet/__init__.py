"""One mesh past one machine: the pure cores of a sharded controller, and its shell on NATS.

The cores (values in, values out, time passed in):

- `grid`: the fleet-wide window grid (window k = [k W, (k+1) W) of UNIX ns);
- `worker`: `FleetWorker`, what an ingest worker runs: admit, ingest, one partial per window;
- `partial`: `Partial`, one worker's reduction of one window, and its codec;
- `solver`: `FleetSolver`, what the controller at the centre runs: merge, solve, judge;
- `state`: `FleetState`, what the solver hands the workers after a window, and its codec;
- `codec`: the columnar frame both payloads travel in.

`controller.live.LiveController` runs one worker and the solver in one process. The shell
that runs them apart on NATS JetStream (docs/scale.md): `plane` (names, sizes, the window
grid's shell settings), `partials` (partials on the wire: chunks and the commit that makes one
build count), `book` (which windows the solver may solve, late partials), `cores` (what the
shells need of the cores), `workerloop` (``qpmesh controller worker``), `solverloop` (the
solver's lease, partial reader and solves, inside ``qpmesh controller`` with ``[fleet]``).
"""
