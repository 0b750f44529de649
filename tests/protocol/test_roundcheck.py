"""protocol/roundcheck.py: which copy of a stage is kept when two members stepped in different rounds."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from gwtf_node.protocol.roundcheck import KEEP_ROUNDS, Copy, RoundOf, Verdict, decide, parted_at, ranks_higher, trim

FULL = RoundOf(4.0, ("a", "b"))


def test_the_same_hash_is_the_same_copy_whatever_the_records_say() -> None:
    v, _ = decide(Copy(5, "h", {5: RoundOf(2.0, ("a",))}), Copy(5, "h", {5: RoundOf(2.0, ("b",))}), Verdict.KEEP)
    assert v is Verdict.SAME


def test_different_steps_wait() -> None:
    assert decide(Copy(5, "h", {}), Copy(6, "g", {}), Verdict.YIELD) == (Verdict.WAIT, None)


def test_the_copy_that_summed_more_contributions_where_they_parted_is_kept() -> None:
    # a alone with 1 contribution, b alone with 3: both stepped 5 -> 6, then a full round each
    a = {5: FULL, 6: RoundOf(1.0, ("a",)), 7: FULL}
    b = {5: FULL, 6: RoundOf(3.0, ("b",)), 7: FULL}
    assert decide(Copy(7, "ha", a), Copy(7, "hb", b), Verdict.KEEP) == (Verdict.YIELD, 6)
    assert decide(Copy(7, "hb", b), Copy(7, "ha", a), Verdict.YIELD) == (Verdict.KEEP, 6)


def test_ties_go_to_the_larger_round_then_the_smaller_member_list() -> None:
    assert ranks_higher(RoundOf(2.0, ("a", "c")), RoundOf(2.0, ("b",)))
    assert ranks_higher(RoundOf(2.0, ("a",)), RoundOf(2.0, ("b",)))
    assert not ranks_higher(RoundOf(2.0, ("b",)), RoundOf(2.0, ("a",)))
    assert ranks_higher(RoundOf(3.0, ("b",)), RoundOf(2.0, ("a", "c")))


def test_no_record_that_tells_them_apart_takes_the_fallback() -> None:
    assert decide(Copy(7, "ha", {7: FULL}), Copy(7, "hb", {7: FULL}), Verdict.YIELD) == (Verdict.YIELD, None)
    assert decide(Copy(7, "ha", {}), Copy(7, "hb", {6: FULL}), Verdict.KEEP) == (Verdict.KEEP, None)


def test_parted_at_is_the_first_step_whose_rounds_differ() -> None:
    mine = {3: FULL, 4: RoundOf(1.0, ("a",)), 5: RoundOf(1.0, ("a",))}
    theirs = {4: RoundOf(2.0, ("b", "c")), 5: RoundOf(1.0, ("b",))}
    assert parted_at(mine, theirs) == 4
    assert parted_at(mine, {3: FULL}) is None


def test_trim_keeps_the_last_records() -> None:
    rounds = {s: FULL for s in range(200)}
    kept = trim(rounds)
    assert sorted(kept) == list(range(200 - KEEP_ROUNDS, 200))


rounds_st = st.builds(RoundOf, st.integers(0, 4).map(float),
                      st.lists(st.sampled_from("abcd"), min_size=1, max_size=4, unique=True).map(lambda x: tuple(sorted(x))))


@given(rounds_st, rounds_st)
def test_exactly_one_of_two_copies_that_parted_yields(x: RoundOf, y: RoundOf) -> None:
    """Both members decide with the same information: one keeps and the other yields, never both or neither."""
    if x.members == y.members:
        return
    mine, theirs = Copy(9, "hx", {9: x}), Copy(9, "hy", {9: y})
    v1, _ = decide(mine, theirs, Verdict.KEEP)
    v2, _ = decide(theirs, mine, Verdict.KEEP)
    assert {v1, v2} == {Verdict.KEEP, Verdict.YIELD}


def test_members_that_summed_together_rank_alike_against_a_third() -> None:
    """b and c summed together, a alone: both b and c reach the same verdict against a."""
    a, bc = RoundOf(2.0, ("a",)), RoundOf(2.0, ("b", "c"))
    for count_a, count_bc in itertools.product((1.0, 2.0, 3.0), repeat=2):
        a2, bc2 = RoundOf(count_a, a.members), RoundOf(count_bc, bc.members)
        va, _ = decide(Copy(1, "ha", {1: a2}), Copy(1, "hb", {1: bc2}), Verdict.KEEP)
        vb, _ = decide(Copy(1, "hb", {1: bc2}), Copy(1, "ha", {1: a2}), Verdict.KEEP)
        vc, _ = decide(Copy(1, "hc", {1: bc2}), Copy(1, "ha", {1: a2}), Verdict.KEEP)
        assert vb == vc and {va, vb} == {Verdict.KEEP, Verdict.YIELD}
