"""The IMDSv2 client and interruption watcher against AWS's amazon-ec2-metadata-mock."""

import threading
import urllib.error
import urllib.request

import pytest

from dinrec.spot.imds import Imds, ImdsError, InterruptionNotice, InterruptionWatcher
from tests.conftest import wait_until


def test_no_notice_until_the_mock_announces_one(metadata_mock):
    url = metadata_mock("spot", "--mock-delay-sec", "2")  # IMDSv2 only: every read needs a token
    with pytest.raises(urllib.error.HTTPError) as v1:
        urllib.request.urlopen(url + "/latest/meta-data/instance-id", timeout=2)
    v1.value.close()
    assert v1.value.code == 401  # the mock refuses IMDSv1, as a launch template with HttpTokens=required does
    imds = Imds(url)
    instance_id = imds.instance_id()
    assert instance_id is not None and instance_id.startswith("i-")
    assert imds.interruption() is None
    notice = wait_until(imds.interruption, timeout_s=15, interval_s=0.2, what="the mock's notice")
    assert notice.action == "terminate" and notice.time.endswith("Z")


def test_expired_token_is_renewed_once(metadata_mock):
    imds = Imds(metadata_mock("events"))
    assert imds.instance_id()
    imds._token = "expired-or-foreign"  # the mock answers 401, as IMDS does for a stale token
    instance_id = imds.instance_id()
    assert instance_id is not None and instance_id.startswith("i-") and imds._token != "expired-or-foreign"
    assert imds.interruption() is None and not imds.rebalance_recommended()  # events mode: no spot notice


def test_watcher_calls_back_once_for_rebalance_and_interruption(metadata_mock):
    imds = Imds(metadata_mock("spot", "--mock-delay-sec", "1", "--rebalance-delay-sec", "0"))
    rebalances: list[int] = []
    notices: list[InterruptionNotice] = []
    done = threading.Event()

    def on_interruption(notice: InterruptionNotice) -> None:
        notices.append(notice)
        done.set()

    watcher = InterruptionWatcher(imds, on_rebalance=lambda: rebalances.append(1), on_interruption=on_interruption,
                                  poll_s=0.2).start()
    assert done.wait(15), "no interruption notice seen"
    assert watcher._thread is not None
    watcher._thread.join(timeout=10)  # the watcher ends itself at the notice: no more polls, no second callback
    assert not watcher._thread.is_alive()
    watcher.stop()
    assert len(rebalances) == 1 and len(notices) == 1 and notices[0].action == "terminate"


def test_unreachable_imds_is_a_clear_error_and_the_watcher_keeps_polling():
    from tests.conftest import free_port

    imds = Imds(f"http://127.0.0.1:{free_port()}", timeout_s=0.5)
    with pytest.raises(ImdsError, match="token request"):
        imds.interruption()
    watcher = InterruptionWatcher(imds, on_interruption=lambda n: None, poll_s=0.1).start()
    wait_until(lambda: watcher.errors >= 3, timeout_s=30, what="three failed polls")
    assert watcher._thread is not None
    assert watcher._thread.is_alive()  # errors are logged, not fatal: IMDS may come back
    watcher.stop()


def test_a_callback_that_raises_is_logged_and_the_watcher_still_sees_the_notice(metadata_mock, caplog):
    """The watcher's loop is storage.loops.every: before it, an exception from anything but IMDS (here the
    rebalance callback) ended the thread, and the interruption notice two minutes before the instance
    went away was never seen."""
    imds = Imds(metadata_mock("spot", "--mock-delay-sec", "1", "--rebalance-delay-sec", "0"))
    notices: list[InterruptionNotice] = []
    done = threading.Event()

    def on_rebalance() -> None:
        raise RuntimeError("checkpoint request failed")

    def on_interruption(notice: InterruptionNotice) -> None:
        notices.append(notice)
        done.set()

    watcher = InterruptionWatcher(imds, on_rebalance=on_rebalance, on_interruption=on_interruption,
                                  poll_s=0.2).start()
    assert done.wait(15), "the watcher ended at the callback's error"
    watcher.stop()
    assert len(notices) == 1 and watcher.rebalanced
    assert any("spot-watcher failed" in r.getMessage() and "checkpoint request failed" in r.getMessage()
               for r in caplog.records if r.name == "dinrec.loops")
