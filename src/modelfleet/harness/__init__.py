"""Test-harness builders shipped with modelfleet: the tiny model and the local hub repo. They are
used by the tests, the molecule scenarios and the local fleet demo, and make everything from
installed packages only (no download)."""
