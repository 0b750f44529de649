"""The link meter's arithmetic: the re-costing threshold, the smoothing, and the real traffic folded in."""

from __future__ import annotations

import pytest

from gwtf_node.runtime.node import linkmeter
from gwtf_node.runtime.node.linkmeter import LinkMeter, LinkSample, recost_threshold, smoothed_bandwidth


def test_recost_threshold_needs_half_and_20_ms() -> None:
    assert recost_threshold(100.0, 140.0) == 0  # +40 %: not half
    assert recost_threshold(100.0, 160.0) == 1 and recost_threshold(100.0, 40.0) == -1
    assert recost_threshold(10.0, 25.0) == 0  # +150 % but 15 ms: loopback jitter
    assert recost_threshold(10.0, 31.0) == 1


def test_bandwidth_is_smoothed_as_time_per_megabit() -> None:
    assert smoothed_bandwidth(None, 50.0) == 50.0 and smoothed_bandwidth(50.0, None) == 50.0
    assert smoothed_bandwidth(None, None) is None
    # a mean of 10,000 and 0.5 Mbit/s is not 5,000: twice the slow one (equal weights on the time per megabit)
    assert smoothed_bandwidth(10_000.0, 0.5) == pytest.approx(1 / (0.5 / 0.5 + 0.5 / 10_000.0))


def _meter() -> LinkMeter:
    return LinkMeter(None, None, None, None)  # (observe touches none of them)


def test_real_payloads_are_folded_into_a_measured_link() -> None:
    meter = _meter()
    meter.observe("p", 4 << 20, 0.5)  # a link never measured: nothing to fold into
    assert "p" not in meter.samples and meter.observed == 0
    meter.samples["p"] = LinkSample(40.0, 1000.0, 5.0)
    meter.observe("p", 1000, 0.5)  # below OBSERVE_MIN_BYTES: scheduling, not the link
    meter.observe("p", 4 << 20, None)  # not timed (it came over libp2p)
    assert meter.samples["p"].bandwidth_mbps == 1000.0 and meter.observed == 0
    size = 4 << 20
    meter.observe("p", size, size * 8 / 10e6)  # 4 MiB at 10 Mbit/s
    s = meter.samples["p"]
    assert s.bandwidth_mbps == pytest.approx(smoothed_bandwidth(1000.0, 10.0))
    assert (s.rtt_ms, s.peer_compute_ms, s.observed, meter.observed) == (40.0, 5.0, 1, 1)
    for _ in range(10):
        meter.observe("p", size, size * 8 / 10e6)
    assert meter.samples["p"].bandwidth_mbps == pytest.approx(10.0, rel=0.01)  # the throttled link shows
    meter.observe("p", linkmeter.OBSERVE_MIN_BYTES, 0.0)  # instant: capped, not infinite
    assert meter.samples["p"].bandwidth_mbps < linkmeter.MAX_BANDWIDTH_MBPS


def test_a_peer_on_this_machine_is_known_by_its_loopback_connection() -> None:
    class Host:  # what `remote_host` says of each connection (conninfo.py): the IP it comes from
        def remote_host(self, peer: str) -> str | None:
            return {"here": "127.0.0.1", "here6": "::1", "away": "198.18.0.7"}.get(peer)

    class Wire:
        host = Host()

    meter = LinkMeter(Wire(), None, None, None)
    assert meter.on_this_machine("here") and meter.on_this_machine("here6")
    assert not meter.on_this_machine("away")
    assert not meter.on_this_machine("unknown")  # not connected: not known to be here, measured as any other
