"""The MQTT link shared by probers, the controller and recovery agents.

- `mqttlink.settings`: `BrokerSettings` (where and how to reach the broker, validated) and the
  broker errors every loop catches;
- `mqttlink.reconnect`: the one reconnect loop (exponential backoff that resets after a
  connection that worked) that every long-lived MQTT client runs;
- `mqttlink.follow`: the one follower session (connect, subscribe to one filter, hand each
  message to an apply function) that the prober's neighbours and RDMA presence followers run.

Imports only `contract` and aiomqtt; every service package may import it.
"""
