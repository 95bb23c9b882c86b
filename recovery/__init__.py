"""The recovery agent that runs inside a training job (PyTorch: the ``recovery`` extra).

- `recovery.machine`: the pure state machine (actions, safe points, stuck collectives,
  re-forms, acks), time passed in;
- `recovery.gloo`: the gloo shell: a process group that can be abandoned and re-formed on
  another interface through a rendezvous store, collectives with short timeouts;
- `recovery.nccl`: the NCCL path (fresh process for a moved rank, communicator abort), and
  `recovery.health`: a NIC health check for nvidia-resiliency-ext / torchft;
- `recovery.follow`: the MQTT follower (remediation topics of the rank's NICs, acks).

See docs/recovery.md.
"""
