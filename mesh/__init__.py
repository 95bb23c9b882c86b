"""The shared vocabulary of the mesh: the fabric model (`mesh.fabric`) and the live-state
snapshot (`mesh.snapshot`), read by the controller, the TUI, the simulator and the testbed.
Imports only `contract` (a snapshot's events are `contract.documents.EventDoc`)."""
