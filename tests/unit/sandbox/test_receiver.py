"""The sandbox's catch-all receiver for users' webhooks: signatures checked per path, and
paths made to fail for a while."""

from __future__ import annotations

import time

from shared.outbound import outbound_signing
from tests.unit.sandbox.conftest import Harness

SECRET = outbound_signing.new_secret()


def _signed(body: bytes, secret: str = SECRET) -> dict[str, str]:
    return outbound_signing.headers("msg_1", int(time.time()), body, [secret])


async def test_a_request_signed_with_the_paths_secret_is_verified(sandbox: Harness) -> None:
    """Recorded with ``verified: true``."""
    await sandbox.client.post("/_control/receiver/secrets", json={"path": "/h", "secret": SECRET})

    await sandbox.client.post("/_receiver/h", content=b"{}", headers=_signed(b"{}"))

    (seen,) = (await sandbox.client.get("/_control/received?path=/h")).json()
    assert seen["verified"] is True and seen["status"] == 200


async def test_a_request_signed_with_another_secret_is_not(sandbox: Harness) -> None:
    """Recorded with ``verified: false`` (and still answered 200)."""
    await sandbox.client.post("/_control/receiver/secrets", json={"path": "/h", "secret": SECRET})

    other = outbound_signing.new_secret()
    answer = await sandbox.client.post("/_receiver/h", content=b"{}", headers=_signed(b"{}", other))

    (seen,) = (await sandbox.client.get("/_control/received?path=/h")).json()
    assert answer.status_code == 200
    assert seen["verified"] is False


async def test_a_path_without_a_secret_is_not_judged(sandbox: Harness) -> None:
    """``verified`` is null where no secret was registered."""
    await sandbox.client.post("/_receiver/plain", content=b"{}")

    (seen,) = (await sandbox.client.get("/_control/received?path=/plain")).json()
    assert seen["verified"] is None


async def test_a_failing_path_answers_its_status_count_times(sandbox: Harness) -> None:
    """The next ``count`` requests get the status, then 200 again."""
    await sandbox.client.post(
        "/_control/receiver/fail", json={"path": "/down", "status": 503, "count": 2}
    )

    statuses = [(await sandbox.client.post("/_receiver/down")).status_code for _ in range(3)]

    assert statuses == [503, 503, 200]


async def test_a_path_fails_until_cleared_without_a_count(sandbox: Harness) -> None:
    """No count: failing until ``DELETE /_control/receiver/fail?path=``."""
    await sandbox.client.post("/_control/receiver/fail", json={"path": "/down", "status": 500})
    before = [(await sandbox.client.post("/_receiver/down")).status_code for _ in range(3)]

    await sandbox.client.delete("/_control/receiver/fail?path=/down")

    assert before == [500, 500, 500]
    assert (await sandbox.client.post("/_receiver/down")).status_code == 200


async def test_a_bad_secret_is_refused(sandbox: Harness) -> None:
    """Only ``whsec_`` secrets can be registered."""
    answer = await sandbox.client.post(
        "/_control/receiver/secrets", json={"path": "/h", "secret": "nope"}
    )

    assert answer.status_code == 422
