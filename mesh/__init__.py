"""The shared vocabulary of the mesh: the fabric model (`mesh.fabric`), the live-state
snapshot (`mesh.snapshot`) and the HTTP API's documents of it (`mesh.documents`: encoders and
decoders side by side), read by the controller, the TUI, the simulator and the testbed.
Imports only `contract` (a snapshot's events are `contract.documents.EventDoc`)."""
