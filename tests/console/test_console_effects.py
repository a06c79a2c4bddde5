"""Open effects in the console, and settling one by hand over HTTP (``Runtime.resolve_effect``).

On SQLite and PostgreSQL. Bad inputs tried: no token, an unknown resolution, a
rejection without a reason, ``NaN`` in the body, an unknown effect key, settling the
same effect twice.
"""

from __future__ import annotations

from typing import Any

import trio

from loop_actors import Runtime
from tests.support.console import bearer, client, serving
from tests.support.effects import KEY, api_agent, paused_run


async def test_an_open_effect_is_settled_by_hand_once(store_url: str) -> None:
    seen: list[Any] = []
    with trio.fail_after(30):
        async with Runtime(store_url) as runtime:
            await paused_run(runtime, api_agent(seen))
        async with serving(store_url) as base, client(base) as http:
            url = f"/api/effects/{KEY}/resolve"
            listed = (await http.get("/api/effects?status=open")).json()["effects"]
            page = await http.get("/effects")
            without_token = await http.post(url, json={"resolution": "committed", "by": "ann"})
            http.headers.update(bearer())
            unknown_resolution = await http.post(url, json={"resolution": "maybe", "by": "ann"})
            no_reason = await http.post(url, json={"resolution": "rejected", "by": "ann"})
            not_a_number = await http.post(
                url,
                content=b'{"resolution": "committed", "by": "ann", "receipt": NaN}',
                headers={"Content-Type": "application/json"},
            )
            unknown_key = await http.post(
                "/api/effects/eff-nothing/resolve", json={"resolution": "committed", "by": "ann"}
            )
            resolved = await http.post(
                url, json={"resolution": "committed", "by": "ann", "receipt": {"id": "w-1"}}
            )
            again = await http.post(url, json={"resolution": "committed", "by": "ann"})
            left = (await http.get("/api/effects")).json()["effects"]
    assert [row["effect_key"] for row in listed] == [KEY]
    assert KEY in page.text
    assert without_token.status_code == 401
    assert unknown_resolution.status_code == 400
    assert no_reason.status_code == 409
    assert no_reason.json()["error"] == "not_resolvable"
    assert not_a_number.status_code == 400
    assert unknown_key.status_code == 404
    assert resolved.status_code == 200, resolved.text
    assert resolved.json()["resolution"] == "committed"
    assert resolved.json()["resumable"] is True
    assert again.status_code == 409
    assert left == []
