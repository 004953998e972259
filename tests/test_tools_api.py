"""The tool authoring API is what `tools` itself exports, and nothing more: a tool module
needs these four names, and everything else is imported from the module that owns it."""

from __future__ import annotations

import tools


def test_the_package_exports_exactly_the_authoring_api() -> None:
    assert sorted(tools.__all__) == ["ToolContext", "ToolError", "register_tool", "tool"]
    public = {name for name in vars(tools) if not name.startswith("_")}
    # submodules become attributes once imported; anything else must be in __all__
    assert {n for n in public if not isinstance(getattr(tools, n), type(tools))} == set(
        tools.__all__
    )


def test_a_tool_module_written_with_the_api_alone_declares_a_working_tool() -> None:
    from tools.execute import execute
    from tools.registry import ToolRegistry

    local = ToolRegistry()

    @tools.tool(effect="read", registry=local)
    def shout(ctx: tools.ToolContext, text: str) -> str:
        """Shout it.

        Args:
            text: What to shout.
        """
        if not text:
            raise tools.ToolError("nothing to shout")
        return text.upper()

    declared = local.get("shout")
    assert declared is not None
    context = tools.ToolContext(user_id="U1", team_id="T1", channel_id="C1", run_id="r1")
    assert execute(declared, context, {"text": "hi"}).text == "HI"
    refused = execute(declared, context, {"text": ""})
    assert not refused.ok and refused.text == "nothing to shout"
