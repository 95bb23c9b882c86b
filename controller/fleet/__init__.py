"""One mesh past one machine: the pure cores of a sharded controller.

- `grid`: the fleet-wide window grid (window k = [k W, (k+1) W) of UNIX ns);
- `worker`: `FleetWorker`, what an ingest worker runs: admit, ingest, one partial per window;
- `partial`: `Partial`, one worker's reduction of one window, and its codec;
- `solver`: `FleetSolver`, what the controller at the centre runs: merge, solve, judge;
- `state`: `FleetState`, what the solver hands the workers after a window, and its codec;
- `codec`: the columnar frame both payloads travel in.

Values in, values out, time passed in: the distributed shell (streams, leases, processes)
lives elsewhere and calls exactly these. `controller.live.LiveController` runs one worker
and the solver in one process.
"""
