"""lldpcli output recorded on this kind of machine, for the parsers' tests."""

# recorded: `lldpcli -f json0 show neighbors` of lldpd 1.0.16 in a namespace whose veth faces a
# namespace announcing the system name "leaf0" (kernel line shortened)
LLDP_JSON0 = """{"lldp": [{"interface": [{"name": "va", "via": "LLDP", "rid": "1", "age": "0 day, 00:00:03",
 "chassis": [{"id": [{"type": "mac", "value": "fe:56:f5:7d:0e:9e"}], "name": [{"value": "leaf0"}],
   "descr": [{"value": "Debian GNU/Linux 12 (bookworm) Linux 6.x"}],
   "mgmt-ip": [{"value": "10.0.0.254"}, {"value": "fe80::fc56:f5ff:fe7d:e9e"}],
   "mgmt-iface": [{"value": "2"}, {"value": "2"}],
   "capability": [{"type": "Bridge", "enabled": false}, {"type": "Router", "enabled": false}]}],
 "port": [{"id": [{"type": "mac", "value": "fe:56:f5:7d:0e:9e"}], "descr": [{"value": "vb"}],
   "ttl": [{"value": "4"}]}]}]}]}"""  # fmt: skip
