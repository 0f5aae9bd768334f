"""Decisions, verdicts and leases read as the named tuples they were: unpacked, indexed,
compared, hashed, copied with changes, on both builds."""

import pickle

import pytest

from ratelimit_mw import Limit
from ratelimit_mw.decision import NEVER, Decision, Lease, Verdict

LIMIT = Limit("10/minute")


def test_a_decision_unpacks_and_indexes_in_field_order() -> None:
    decision = Decision(True, 10, 7, 60.0, 0.0, LIMIT, "route")
    allowed, quota, remaining, reset_after, retry_after, limit, scope = decision
    assert (allowed, quota, remaining, reset_after, retry_after, limit, scope) == (
        True, 10, 7, 60.0, 0.0, LIMIT, "route")
    assert len(decision) == 7
    assert decision[2] == 7 and decision[-1] == "route"
    assert Decision._fields == ("allowed", "quota", "remaining", "reset_after", "retry_after",
                                "limit", "scope")
    assert Decision(True, 10, 7, 60.0, 0.0, LIMIT).scope == ""


def test_records_compare_and_hash_by_their_fields_and_type() -> None:
    one = Decision(False, 10, 0, 30.0, NEVER, LIMIT)
    assert one == Decision(False, 10, 0, 30.0, NEVER, LIMIT)
    assert hash(one) == hash(Decision(False, 10, 0, 30.0, NEVER, LIMIT))
    assert one != Decision(False, 10, 1, 30.0, NEVER, LIMIT)
    assert one.never
    lease = Lease("k", "", "uid", "1")
    assert lease in {Lease("k", "", "uid", "1")}
    assert lease != ("k", "", "uid", "1")  # a record is not a tuple
    assert Verdict(True, (one,)) == Verdict(True, (one,), (), None)


def test_replace_asdict_and_repr_read_as_a_named_tuples() -> None:
    decision = Decision(True, 10, 7, 60.0, 0.0, LIMIT)
    changed = decision._replace(allowed=False, retry_after=5.0)
    assert (changed.allowed, changed.retry_after, changed.remaining) == (False, 5.0, 7)
    assert decision.allowed  # unchanged
    assert decision._asdict() == {"allowed": True, "quota": 10, "remaining": 7,
                                  "reset_after": 60.0, "retry_after": 0.0, "limit": LIMIT,
                                  "scope": ""}
    assert repr(Lease("k", "s", "u", "1")) == "Lease(key='k', scope='s', uid='u', id='1')"
    verdict = Verdict(False, (changed,), at=1.5)
    assert verdict.retry_after == 5.0 and verdict.binding is changed
    assert verdict._replace(allowed=True).retry_after == 0.0
    with pytest.raises(TypeError):
        decision._replace(colour="red")


def test_records_survive_pickling() -> None:
    verdict = Verdict(True, (Decision(True, 10, 7, 60.0, 0.0, LIMIT),),
                      (Lease("k", "", "uid", "1"),), 12.5)
    assert pickle.loads(pickle.dumps(verdict)) == verdict
