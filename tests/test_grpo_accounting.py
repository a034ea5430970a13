"""Three-way accounting of the GRPO demo, on hand-made records: each failure is named."""

from __future__ import annotations

from rl_data.jobs.grpo.accounting import TRAINED, TrainingRecord, epoch_accounts

KEYS = ["a", "b", "c", "d"]


def _record(rows):
    record = TrainingRecord()
    for uid, key, outcome in rows:
        record.add(uid, key, outcome, step=1)
    return record


def _feed(epoch, acked, dropped, size=4, exact=True):
    return {"epoch": epoch, "acked": acked, "dropped": dropped, "size": size, "resolved_exactly_once": exact}


GOOD = [((0, 0), "c", TRAINED), ((0, 1), "a", "uniform_reward"), ((0, 2), "d", TRAINED), ((0, 3), "b", TRAINED)]


def test_an_exact_epoch_passes():
    [account] = epoch_accounts(_record(GOOD), KEYS, [_feed(0, 3, {"uniform_reward": 1})], 1)
    assert (account.trained, account.dropped, account.duplicates, account.missing) == (3, {"uniform_reward": 1}, 0, 0)
    assert account.feed_agrees and account.exactly_once


def test_missing_duplicated_and_unexpected_prompts_fail():
    missing = _record(GOOD[:3])
    [account] = epoch_accounts(missing, KEYS, [_feed(0, 2, {"uniform_reward": 1}, exact=False)], 1)
    assert account.missing == 1 and not account.exactly_once
    twice = _record(GOOD + [((0, 2), "d", TRAINED)])
    [account] = epoch_accounts(twice, KEYS, [_feed(0, 4, {"uniform_reward": 1})], 1)
    assert account.duplicates == 2 and not account.exactly_once  # the uid and the key
    same_key = _record(GOOD[:3] + [((0, 3), "c", TRAINED)])  # another uid carrying a prompt seen before
    [account] = epoch_accounts(same_key, KEYS, [_feed(0, 3, {"uniform_reward": 1})], 1)
    assert (account.duplicates, account.missing) == (1, 1)
    stranger = _record(GOOD[:3] + [((0, 3), "zz", TRAINED)])
    [account] = epoch_accounts(stranger, KEYS, [_feed(0, 3, {"uniform_reward": 1})], 1)
    assert (account.unexpected, account.missing) == (1, 1)


def test_a_feed_that_disagrees_fails():
    [account] = epoch_accounts(_record(GOOD), KEYS, [_feed(0, 2, {"uniform_reward": 2})], 1)
    assert account.duplicates == account.missing == 0 and not account.feed_agrees and not account.exactly_once
    [account] = epoch_accounts(_record(GOOD), KEYS, [], 1)
    assert not account.feed_agrees


def test_the_record_round_trips_as_plain_data():
    record = _record(GOOD)
    assert TrainingRecord.from_json(record.to_json()) == record
    assert record.copy() == record and record.copy() is not record


def test_prompts_the_schedule_skipped_are_accounted_by_their_keys():
    from rl_data.prompt_feed.outcomes import keys_digest

    trained = GOOD[:2]  # c trained, a dropped; b and d skipped by the schedule
    skipped = {"retired": 1, "deferred": 1}
    feed = {**_feed(0, 1, {"uniform_reward": 1}), "skipped": skipped, "skipped_digest": keys_digest(["d", "b"])}
    [account] = epoch_accounts(_record(trained), KEYS, [feed], 1)
    assert (account.skipped, account.missing) == (skipped, 0) and account.exactly_once
    # the feed skipped d and another key, not b: b is unresolved, not skipped -> both count as missing
    wrong = {**feed, "skipped_digest": keys_digest(["d", "zz"])}
    [account] = epoch_accounts(_record(trained), KEYS, [wrong], 1)
    assert account.missing == 2 and not account.exactly_once
    fewer = {**feed, "skipped": {"retired": 1}, "skipped_digest": keys_digest(["d"])}  # b neither resolved nor skipped
    [account] = epoch_accounts(_record(trained), KEYS, [fewer], 1)
    assert account.missing == 2 and not account.exactly_once
