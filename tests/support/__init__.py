"""What the tests share: the Slack bot under test (slack_bot), the runtime and waiting on
observable state (runtime), worker processes (processes), a private Redis (redis_server), a
terminal for the console (terminal), real MCP servers (mcp_servers, mcp_server), and the fault
tests' tools (fault_tools). The fakes of Slack and OpenAI are in tests/fakes/."""
