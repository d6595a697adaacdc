"""The observed-step rule's words for a server that cannot be read: the URL said once, whether the message came from
the poller (which names it) or from elsewhere (which does not)."""

from __future__ import annotations

from decodetop.collectors.serving import ServerState, ServerStatus, ServerStepSource
from decodetop.pipeline.observed import observed_step, server_header

URL = "http://127.0.0.1:1/metrics"
"""Port 1 on loopback: nothing listens there, the connection is refused at once."""


def test_an_unreachable_server_is_named_once_in_the_header_and_the_default_step() -> None:
    answer = ServerStepSource(URL, timeout_s=2.0).poll()
    assert isinstance(answer, ServerStatus) and answer.state is ServerState.UNREACHABLE
    header = server_header(answer)
    assert header.count(URL) == 1 and header.startswith(f"server {URL}: unreachable")
    step = observed_step(server=answer, server_url=URL, now_s=0.0)
    assert step.assumed and step.text.count(URL) == 1, step.text


def test_a_message_without_the_url_gets_it() -> None:
    answer = ServerStatus(ServerState.UNREACHABLE, "connection refused", URL)
    assert server_header(answer) == f"server {URL}: connection refused — the observed step is not live"
