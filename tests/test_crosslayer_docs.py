"""docs/crosslayer.md's catalogue table says what `contract.signals.CATALOGUE` says."""

from __future__ import annotations

from pathlib import Path

from contract.signals import CATALOGUE

DOC = Path(__file__).resolve().parent.parent / "docs" / "crosslayer.md"


def test_the_catalogue_table_is_the_catalogue() -> None:
    text = DOC.read_text()
    table = text.split("<!-- catalogue:begin -->")[1].split("<!-- catalogue:end -->")[0]
    rows = [r.split("|")[1:-1] for r in table.strip().splitlines()[2:]]
    got = {r[0].strip().strip("`"): [c.strip() for c in r[1:]] for r in rows}
    assert list(got) == [s.name for s in CATALOGUE]
    for s in CATALOGUE:
        entity, kind, unit, source, trouble, resolution, meaning = got[s.name]
        assert (entity, unit, source, meaning) == (s.entity.value, s.unit, s.source, s.help)
        assert kind.startswith(s.kind.value) and trouble.startswith(s.bad)
        assert float(resolution.split()[0]) == s.scale and resolution.endswith("log") == s.log
