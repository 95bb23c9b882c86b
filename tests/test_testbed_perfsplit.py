"""`testbed.perfsplit`: the CPU split of `qpmesh testbed prober-cpu --perf` from perf's text."""

from __future__ import annotations

from testbed.perfsplit import parse_children_share, parse_dso_shares, split

DSOS = """# Samples: 4K of event 'cpu-clock:ppp'
#
    82.92%  [kernel.kallsyms]
    11.64%  libpython3.11.so.1.0
     3.62%  _fastpath.cpython-311-x86_64-linux-gnu.so
     0.62%  libc.so.6
     0.43%  _multiarray_umath.cpython-311-x86_64-linux-gnu.so
     0.02%  [vdso]
"""

SYMS = """#
    80.91%     0.12%  [k] do_syscall_64
    20.58%     0.91%  [k] net_rx_action
    18.90%     0.26%  [k] __napi_poll
"""


def test_split_sorts_samples_into_kernel_softirq_engine_python_other() -> None:
    shares = parse_dso_shares(DSOS)
    assert shares["[kernel.kallsyms]"] == 0.8292 and len(shares) == 6
    assert abs(parse_children_share(SYMS, "net_rx_action") - 0.2058) < 1e-9
    assert parse_children_share(SYMS, "__do_softirq") == 0.0
    got = split(shares, parse_children_share(SYMS, "net_rx_action"))
    assert got == {"kernel": 0.829, "kernel_net_rx_softirq": 0.206, "engine": 0.036,
                   "python": 0.121, "other": 0.006}  # fmt: skip


def test_softirq_share_never_exceeds_the_kernel_share() -> None:
    assert (
        split({"[kernel.kallsyms]": 0.1, "libpython3.11.so": 0.9}, 0.5)["kernel_net_rx_softirq"]
        == 0.1
    )
