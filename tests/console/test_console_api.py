"""The console's JSON API over HTTP, against a real server (hypercorn's trio worker).

On SQLite and PostgreSQL (``store_url``). Bad inputs tried: no token, a wrong token, a
second approval, a wrong digest, an unknown invocation, a malformed and a non-object
JSON body, a missing field, an unknown action, an unknown status or reason filter, a
limit out of range, ``Host: attacker.example``, a cross-origin POST (``Origin`` and
``Sec-Fetch-Site``) carrying the token.
"""

from __future__ import annotations

import trio

from loop_actors import Runtime
from tests.support.console import (
    HOSTILE,
    TOKEN,
    asker,
    bearer,
    client,
    completed_refund,
    event_types,
    paused_refund,
    serving,
)


async def test_an_approval_without_the_token_is_401_and_records_nothing(store_url: str) -> None:
    digest = await paused_refund(store_url)
    before = await event_types(store_url, "refund-1")
    with trio.fail_after(30):
        async with serving(store_url) as base, client(base) as http:
            body = {"digest": digest, "by": "mallory"}
            missing = await http.post("/api/invocations/refund-1/approve", json=body)
            wrong = await http.post(
                "/api/invocations/refund-1/approve", json=body, headers=bearer("x" * 24)
            )
            inbox = await http.get("/api/approvals")
    assert missing.status_code == 401
    assert missing.json()["error"] == "unauthorised"
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert wrong.status_code == 401
    assert await event_types(store_url, "refund-1") == before
    assert [item["invocation_id"] for item in inbox.json()["approvals"]] == ["refund-1"]


async def test_a_second_approval_is_409_already_decided(store_url: str) -> None:
    digest = await paused_refund(store_url)
    with trio.fail_after(30):
        async with serving(store_url) as base, client(base, headers=bearer()) as http:
            body = {"digest": digest, "by": "alice", "note": "receipt seen"}
            first = await http.post("/api/invocations/refund-1/approve", json=body)
            second = await http.post(
                "/api/invocations/refund-1/approve", json={**body, "by": "bob"}
            )
            shown = await http.get("/api/invocations/refund-1")
    assert first.status_code == 200
    assert first.json()["recorded"] == "approved"
    assert second.status_code == 409
    assert second.json()["error"] == "already_decided"
    assert "already decided" in second.json()["detail"]
    decisions = shown.json()["decisions"]
    assert [(d["kind"], d["by"], d["why"]) for d in decisions] == [
        ("approved", "alice", "receipt seen")
    ]
    assert shown.json()["waiting"] is None


async def test_a_wrong_digest_is_409_other_digest_and_records_nothing(store_url: str) -> None:
    await paused_refund(store_url)
    before = await event_types(store_url, "refund-1")
    with trio.fail_after(30):
        async with serving(store_url) as base, client(base, headers=bearer()) as http:
            refused = await http.post(
                "/api/invocations/refund-1/approve", json={"digest": "0" * 64, "by": "alice"}
            )
    assert refused.status_code == 409
    assert refused.json()["error"] == "other_digest"
    assert await event_types(store_url, "refund-1") == before


async def test_an_unknown_invocation_is_404(store_url: str) -> None:
    await paused_refund(store_url)
    with trio.fail_after(30):
        async with serving(store_url) as base, client(base, headers=bearer()) as http:
            shown = await http.get("/api/invocations/nobody")
            approved = await http.post(
                "/api/invocations/nobody/approve", json={"digest": "0" * 64, "by": "alice"}
            )
            streamed = await http.get("/api/invocations/nobody/events")
            page = await http.get("/invocations/nobody")
    assert shown.status_code == 404
    assert shown.json()["error"] == "not_found"
    assert approved.status_code == 404
    assert streamed.status_code == 404
    assert page.status_code == 404


async def test_malformed_bodies_are_400_and_record_nothing(store_url: str) -> None:
    await paused_refund(store_url)
    before = await event_types(store_url, "refund-1")
    with trio.fail_after(30):
        async with serving(store_url) as base, client(base, headers=bearer()) as http:
            url = "/api/invocations/refund-1/approve"
            not_json = await http.post(
                url, content=b"{not json", headers={"Content-Type": "application/json"}
            )
            not_object = await http.post(url, json=["approve"])
            no_digest = await http.post(url, json={"by": "alice"})
            digest_not_text = await http.post(url, json={"digest": 7, "by": "alice"})
            unknown_action = await http.post("/api/invocations/refund-1/launch", json={})
    for response in (not_json, not_object, no_digest, digest_not_text):
        assert response.status_code == 400, response.text
        assert response.json()["error"] == "bad_request"
    assert unknown_action.status_code == 404
    assert await event_types(store_url, "refund-1") == before


async def test_deny_and_cancel_go_through_the_runtime(store_url: str) -> None:
    await paused_refund(store_url, "refund-1")
    await paused_refund(store_url, "refund-2")
    with trio.fail_after(30):
        async with serving(store_url) as base, client(base, headers=bearer()) as http:
            no_reason = await http.post("/api/invocations/refund-1/deny", json={"by": "bob"})
            denied = await http.post(
                "/api/invocations/refund-1/deny", json={"by": "bob", "reason": "no receipt"}
            )
            cancelled = await http.post(
                "/api/invocations/refund-2/cancel", json={"by": "carol", "reason": "duplicate"}
            )
            not_asked = await http.post("/api/invocations/refund-2/clarify", json={"answer": "yes"})
            inbox = await http.get("/api/approvals")
    assert no_reason.status_code == 400
    assert denied.json()["recorded"] == "denied"
    assert cancelled.json()["result"] == "ended"
    assert not_asked.status_code == 409
    assert not_asked.json()["error"] == "not_waiting"
    assert inbox.json()["approvals"] == []
    assert "ApprovalDenied" in await event_types(store_url, "refund-1")
    assert (await event_types(store_url, "refund-2"))[-1] == "Terminated"


async def test_the_list_filters_and_pages(store_url: str) -> None:
    await paused_refund(store_url, "refund-1")
    await completed_refund(store_url, "refund-2")
    await completed_refund(store_url, "refund-3")
    with trio.fail_after(30):
        async with serving(store_url) as base, client(base) as http:

            async def ids(query: str) -> list[str]:
                response = await http.get(f"/api/invocations?{query}")
                assert response.status_code == 200, response.text
                return [row["invocation_id"] for row in response.json()["invocations"]]

            everything = await ids("")
            paused = await ids("status=paused")
            completed = await ids("reason=completed&roots=1")
            other_agent = await ids("agent=nobody")
            first_page = await http.get("/api/invocations?limit=2")
            second_page = await ids("limit=2&offset=2")
            bad_status = await http.get("/api/invocations?status=sleeping")
            bad_reason = await http.get("/api/invocations?reason=fine")
            bad_limit = await http.get("/api/invocations?limit=0")
    assert everything == ["refund-3", "refund-2", "refund-1"]
    assert paused == ["refund-1"]
    assert completed == ["refund-3", "refund-2"]
    assert other_agent == []
    assert [r["invocation_id"] for r in first_page.json()["invocations"]] == everything[:2]
    assert first_page.json()["next_offset"] == 2
    assert second_page == ["refund-1"]
    for response in (bad_status, bad_reason, bad_limit):
        assert response.status_code == 400, response.text


async def test_the_inbox_shows_the_exact_waiting_batch(store_url: str) -> None:
    digest = await paused_refund(store_url)
    with trio.fail_after(30):
        async with serving(store_url) as base, client(base) as http:
            inbox = (await http.get("/api/approvals")).json()["approvals"]
            effects = await http.get("/api/effects?status=open")
            bad_effects = await http.get("/api/effects?status=closed")
    (item,) = inbox
    assert item["digest"] == digest
    assert item["needs_approval"] == ["r1"]
    assert [(c["name"], c["arguments"]) for c in item["calls"]] == [
        ("refund", {"order_id": "A-1", "amount": 250})
    ]
    assert effects.json() == {"effects": []}  # nothing dispatched before the approval
    assert bad_effects.status_code == 400


async def test_a_request_for_another_host_is_refused() -> None:
    """DNS rebinding: a page of attacker.example that resolves to 127.0.0.1 gets nothing."""
    async with serving("memory://") as base, client(base, headers=bearer()) as http:
        for path in ("/api/invocations", "/invocations", "/static/console.js", "/approvals"):
            response = await http.get(path, headers={"Host": "attacker.example"})
            assert response.status_code == 421, path
            assert response.json()["error"] == "wrong_host"
        posted = await http.post(
            "/api/invocations/x/approve",
            json={"digest": "d", "by": "m"},
            headers={"Host": "attacker.example:8765"},
        )
        assert posted.status_code == 421
        local = await http.get("/api/invocations", headers={"Host": "localhost:8765"})
        assert local.status_code == 200


async def test_a_cross_origin_post_is_refused_even_with_the_token(store_url: str) -> None:
    digest = await paused_refund(store_url)
    before = await event_types(store_url, "refund-1")
    with trio.fail_after(30):
        async with serving(store_url) as base, client(base, headers=bearer()) as http:
            body = {"digest": digest, "by": "mallory"}
            url = "/api/invocations/refund-1/approve"
            origin = await http.post(url, json=body, headers={"Origin": "http://evil.example"})
            site = await http.post(url, json=body, headers={"Sec-Fetch-Site": "cross-site"})
    assert origin.status_code == 403
    assert site.status_code == 403
    assert origin.json()["error"] == "cross_origin"
    assert await event_types(store_url, "refund-1") == before


async def test_every_response_carries_the_content_security_policy() -> None:
    async with serving("memory://") as base, client(base) as http:
        for path in ("/invocations", "/api/invocations", "/static/console.js", "/nowhere"):
            response = await http.get(path)
            policy = response.headers["content-security-policy"]
            assert "script-src 'self'" in policy, path
            assert "frame-ancestors 'none'" in policy
            assert "unsafe-inline" not in policy
            assert response.headers["x-content-type-options"] == "nosniff"
        refused = await http.post("/api/invocations/x/cancel", json={})
        assert "frame-ancestors 'none'" in refused.headers["content-security-policy"]


async def test_tool_output_holding_a_script_is_shown_as_text(store_url: str) -> None:
    await completed_refund(store_url, "refund-done")
    await paused_refund(store_url, "refund-1")  # its goal holds the script too
    with trio.fail_after(30):
        async with serving(store_url) as base, client(base) as http:
            pages = [
                await http.get("/invocations/refund-done"),
                await http.get("/invocations/refund-1"),
                await http.get("/approvals"),
                await http.get("/invocations"),
            ]
    for page in pages:
        assert page.status_code == 200
        assert HOSTILE not in page.text
        assert "&lt;script&gt;alert(" in page.text
        # The only script is ours, from /static/.
        assert page.text.count("<script") == 1
        assert '<script src="/static/console.js" defer></script>' in page.text


async def test_beyond_loopback_every_request_needs_the_token() -> None:
    """Bound to every interface: reads too need the token (the header, or the login cookie)."""
    async with serving("memory://", host="0.0.0.0") as base:  # noqa: S104 - the subject
        async with client(base) as http:
            listed = await http.get("/api/invocations")
            page = await http.get("/invocations")
            login_page = await http.get("/login")
            wrong = await http.post("/login", data={"token": "not-the-token-at-all"})
            logged_in = await http.post("/login", data={"token": TOKEN})
            with_cookie = await http.get("/invocations")
            cookie_cannot_decide = await http.post("/api/invocations/x/cancel", json={})
        async with client(base, headers=bearer()) as http:
            with_header = await http.get("/api/invocations")
    assert listed.status_code == 401
    assert page.status_code == 401
    assert login_page.status_code == 200
    assert wrong.status_code == 401
    assert logged_in.status_code == 303
    cookie = logged_in.headers["set-cookie"].lower()
    assert "httponly" in cookie
    assert "samesite=strict" in cookie
    assert with_cookie.status_code == 200
    assert cookie_cannot_decide.status_code == 401  # a decision needs the header itself
    assert with_header.status_code == 200


async def test_a_bulk_cancel_dry_run_changes_nothing_and_the_typed_confirmation_is_checked(
    store_url: str,
) -> None:
    await paused_refund(store_url, "refund-1")
    await paused_refund(store_url, "refund-2")
    await completed_refund(store_url, "refund-3")
    before = {i: await event_types(store_url, i) for i in ("refund-1", "refund-2", "refund-3")}
    with trio.fail_after(30):
        async with serving(store_url) as base, client(base, headers=bearer()) as http:
            where = {"agent": "refunds"}
            dry = await http.post("/api/bulk/cancel", json={"where": where})
            wrong = await http.post(
                "/api/bulk/cancel",
                json={"where": where, "dry_run": False, "by": "carol", "confirm": "cancel 3"},
            )
            no_name = await http.post(
                "/api/bulk/cancel", json={"where": where, "dry_run": False, "confirm": "cancel 2"}
            )
            bad_where = await http.post("/api/bulk/cancel", json={"where": ["refunds"]})
            after_dry = {i: await event_types(store_url, i) for i in before}
            done = await http.post(
                "/api/bulk/cancel",
                json={"where": where, "dry_run": False, "by": "carol", "confirm": "cancel 2"},
            )
    assert dry.json() == {
        "dry_run": True,
        "matched": 2,
        "invocation_ids": ["refund-2", "refund-1"],
        "skipped": [],
        "confirm": "cancel 2",
    }
    assert wrong.status_code == 409
    assert wrong.json()["error"] == "confirmation_mismatch"
    assert no_name.status_code == 400
    assert bad_where.status_code == 400
    assert after_dry == before
    assert done.json()["results"] == {"refund-2": "ended", "refund-1": "ended"}
    assert await event_types(store_url, "refund-3") == before["refund-3"]
    assert (await event_types(store_url, "refund-1"))[-1] == "Terminated"


async def test_the_list_searches_by_id_and_time_and_sums_up_by_agent_and_status(
    store_url: str,
) -> None:
    await paused_refund(store_url, "refund-1")
    await completed_refund(store_url, "refund-2")
    await completed_refund(store_url, "other_3")
    with trio.fail_after(30):
        async with serving(store_url) as base, client(base) as http:

            async def ids(query: str) -> list[str]:
                response = await http.get(f"/api/invocations?{query}")
                assert response.status_code == 200, response.text
                return [row["invocation_id"] for row in response.json()["invocations"]]

            by_prefix = await ids("id=refund-")
            underscore_is_no_wildcard = await ids("id=other%5F")
            percent_is_no_wildcard = await ids("id=%25")
            since_long_ago = await ids("from=2000-01-01")
            before_long_ago = await ids("before=2000-01-01T00:00:00%2B00:00")
            bad_time = await http.get("/api/invocations?from=yesterday")
            summary = (await http.get("/api/summary")).json()["summary"]
            page = await http.get("/invocations")
    assert by_prefix == ["refund-2", "refund-1"]
    assert underscore_is_no_wildcard == ["other_3"]
    assert percent_is_no_wildcard == []
    assert since_long_ago == ["other_3", "refund-2", "refund-1"]
    assert before_long_ago == []
    assert bad_time.status_code == 400
    assert summary == [
        {"agent": "refunds", "status": "paused", "count": 1},
        {"agent": "refunds", "status": "terminated", "count": 2},
    ]
    assert 'id="summary"' in page.text


async def test_the_metrics_are_charted_by_reason_and_task_class(store_url: str) -> None:
    await paused_refund(store_url, "refund-1")
    await completed_refund(store_url, "refund-2")
    with trio.fail_after(30):
        async with serving(store_url) as base, client(base) as http:
            by_reason = (await http.get("/api/metrics?by=reason")).json()
            bad = await http.get("/api/metrics?by=colour")
            page = await http.get("/metrics?by=task-class")
            bad_page = await http.get("/metrics?by=colour")
    assert by_reason["by"] == "reason"
    counts = {row["group"]: row["invocations"] for row in by_reason["groups"]}
    assert counts == {"approval_required": 1, "completed": 1}
    assert bad.status_code == 400
    assert page.status_code == 200
    assert page.text.count('<rect class="bar"') == 5  # one group (no task class), five charts
    assert bad_page.status_code == 400


async def test_a_question_is_answered_and_shown_escaped(store_url: str) -> None:
    with trio.fail_after(30):
        async with Runtime(store_url) as runtime:
            asked = await runtime.run(asker, "help me", invocation_id="ask-1")
        assert asked.reason.value == "clarification_required"
        async with serving(store_url) as base, client(base, headers=bearer()) as http:
            page = await http.get("/invocations/ask-1")
            empty = await http.post("/api/invocations/ask-1/clarify", json={"answer": " "})
            answered = await http.post(
                "/api/invocations/ask-1/clarify", json={"answer": "A-1", "by": "dan"}
            )
            shown = (await http.get("/api/invocations/ask-1")).json()
    assert 'data-action="clarify"' in page.text
    assert "which order? &lt;script&gt;" in page.text
    assert 'data-action="cancel"' in page.text
    assert empty.status_code == 400
    assert answered.json()["recorded"] == "clarified"
    assert [(d["kind"], d["by"], d["why"]) for d in shown["decisions"]] == [
        ("clarified", "dan", "A-1")
    ]
    assert shown["audit"]["intact"] is True
    assert shown["audit"]["summary"].startswith("1 chain intact")
