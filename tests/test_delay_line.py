"""The delay line (exoframe/emulation/delayline.c) against physics, before anything is
measured with it: round trips idle and beside a full line, one windowed TCP flow at
window / RTT, and random loss at its rate within the binomial spread. Needs root and
network namespaces (skipped cleanly without); the figures are in docs/guides/network-fidelity.md."""
import os

import pytest

from exoframe.emulation.delay_line import DelayLineError, binary
from exoframe.emulation.netns import EmulationError, check_can_emulate


def why_not() -> str | None:
    try:
        check_can_emulate()
        binary()
    except (EmulationError, DelayLineError, OSError) as e:
        return str(e)
    return None


needs_root = pytest.mark.skipif(why_not() is not None, reason=f"no delay line: {why_not()}")


@needs_root
def test_the_delay_line_keeps_round_trips_windows_and_loss_rates():
    from exoframe.emulation.physics import TAG, measure

    figures = measure(delay=0.025, window=256 * 1024, loss=0.01)
    assert figures.failures() == [], "\n".join(figures.report())
    assert figures.lost > 0 and figures.frames >= 20000
    left = [name for name in os.popen("ip netns list").read().split() if f"-{TAG}-" in name]
    assert left == []


def test_a_bad_direction_is_one_line_before_any_socket():
    import subprocess

    import exoframe.emulation.delay_line as delay_line

    try:
        path = binary()
    except DelayLineError as e:
        pytest.skip(str(e))
    for spec, said in (("a,b,0.01,0.02,0.02,0,0,0", "a>b: jitter exceeds the delay"),
                       ("a,b,0,0,0,0,0,1.5", "b>a: loss is a fraction, at most 1"),
                       ("a,b,0.01", "expected IF_A,IF_B,DELAY_AB")):
        done = subprocess.run([str(path), spec], capture_output=True, text=True, timeout=10)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
        assert said in done.stderr
    assert delay_line.Pair("a", "b", delay_line.Direction(0.01),
                           delay_line.Direction(0.02, 0.001, 0.1)).argument() == \
        "a,b,0.01,0.02,0.0,0.001,0.0,0.1"
