"""Test fakes that speak the real protocols over local HTTP: an OpenAI-compatible server
(`FakeOpenAI`) and Slack's Web API (`FakeSlack`), plus helpers to send signed requests to
a Bolt app."""

from tests.fakes.openai_server import FakeOpenAI, Fault, Script, ToolCall, Turn, embed
from tests.fakes.slack_server import FakeSlack, SlackError, send_signed, signed_headers

__all__ = [
    "FakeOpenAI",
    "FakeSlack",
    "Fault",
    "Script",
    "SlackError",
    "ToolCall",
    "Turn",
    "embed",
    "send_signed",
    "signed_headers",
]
