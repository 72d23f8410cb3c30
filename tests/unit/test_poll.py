"""The modules' wait loop (module_utils poll.poll_until) on a fake clock."""

from __future__ import annotations

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.poll import poll_until


class _Clock:
    def __init__(self):
        self.now, self.sleeps = 100.0, []

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.sleeps.append(s)
        self.now += s


def test_returns_the_first_value_that_passes_and_the_time_it_took():
    clock, values = _Clock(), iter([3, 2, 0, 5])
    value, waited, ok = poll_until(lambda: next(values), lambda v: v == 0, 10, 0.5, clock, clock.sleep)
    assert (value, waited, ok) == (0, 1.0, True) and clock.sleeps == [0.5, 0.5]


def test_gives_up_at_the_deadline_with_one_last_read_there():
    clock, reads = _Clock(), []

    def read():
        reads.append(clock.now)
        return "DOWN"

    value, waited, ok = poll_until(read, lambda v: v == "UP", 2.0, 0.8, clock, clock.sleep)
    assert (value, waited, ok) == ("DOWN", 2.0, False)
    # never sleeps past the deadline: the last sleep is cut to what was left, and the state there is read
    assert [round(s, 6) for s in clock.sleeps] == [0.8, 0.8, 0.4] and round(reads[-1], 6) == 102.0


def test_a_zero_timeout_reads_once():
    clock = _Clock()
    assert poll_until(lambda: 1, lambda v: False, 0, 1, clock, clock.sleep) == (1, 0.0, False)
    assert clock.sleeps == []
