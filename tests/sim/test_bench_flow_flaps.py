"""`scripts/bench_flow_flaps.py`: relays presumed dead and taken back one after the other, as a loaded daemon swarm's
liveness checks do; the flows re-form whole with hand-backs at no cost (`FlowConfig.reform_free_back`)."""

from __future__ import annotations

from support.helpers import load_script


def test_six_flaps_leave_the_flows_whole_without_negative_labels():
    """1 + 9 x 11 relays of capacity 1, one-way delays 50-200 ms, seed 2, six relays flapped 3 s apart: the flows
    end at the maximum flow with no OUT label below 0.  With hand-backs priced minus their link's cost (the option
    off), the same flaps leave a unit unplaced, its launch retreating wave after wave, at ten times the messages."""
    bench = load_script("bench_flow_flaps")
    args = dict(stages=9, per_stage=11, delay_ms=(50.0, 200.0), seed=2, flaps=6, gap_s=3.0, detect_s=6.0,
                rounds=120)
    on = bench.flap_run(**args, free_back=True)
    off = bench.flap_run(**args, free_back=False)
    assert on["formed"] == on["flows"] == on["max_flow"] == 11, on
    assert on["negative"] == 0 and on["vs_opt"] < 1.05, on
    assert off["flows"] < off["max_flow"], off
    assert on["msgs_per_node"] < off["msgs_per_node"] / 4, (on, off)
