"""Which agent a run talks to: the operator's instructions and the conversation's profile
(tools/profiles.py), fixed when the run is created.

The run records what its profile decides (name, tool subset, model, instructions), so a
policy reload while it waits for a person does not change the agent under it. Permissions
are not recorded: every step asks the current policy what the user may call, and the
profile only narrows that list; a reload that takes a tool away takes it away at once.
"""

from __future__ import annotations

from pathlib import Path

from tools.exceptions import OperatorError
from tools.policy import Denial, Policy
from tools.profiles import InstructionsTooLong, Profile, read_instructions
from worker.library import Selector
from worker.run import Run, RunProfile
from worker.runtime import Runtime


class InstructionsError(OperatorError, ValueError):
    """SWITCHBOARD_INSTRUCTIONS names a file that cannot be used."""


class UnknownProfile(OperatorError, ValueError):
    """A profile asked for by name (`--profile NAME`) is not in the policy file."""


def load_instructions(path: Path) -> str:
    """The operator's instructions file (SWITCHBOARD_INSTRUCTIONS), bounded."""
    try:
        return read_instructions(path)
    except FileNotFoundError:
        raise InstructionsError(
            f"{path}: instructions file not found (SWITCHBOARD_INSTRUCTIONS)"
        ) from None
    except InstructionsTooLong as exc:
        raise InstructionsError(f"{exc} (SWITCHBOARD_INSTRUCTIONS)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InstructionsError(
            f"{path}: cannot read the instructions file (SWITCHBOARD_INSTRUCTIONS): {exc}"
        ) from None


def named(policy: Policy, name: str) -> Profile:
    profile = policy.profiles.get(name)
    if profile is None:
        known = ", ".join(sorted(policy.profiles)) or "none"
        raise UnknownProfile(
            f"there is no profile {name!r} in {policy.source} (its profiles: {known})"
        )
    return profile


def start(rt: Runtime, run: Run, profile: Profile | None) -> None:
    """Give a new run its agent: the operator's instructions, then the profile's; the
    profile's tool subset, model and reply bound."""
    parts = [rt.settings.instructions, profile.instructions if profile else ""]
    run.instructions = "\n\n".join(part for part in parts if part)
    if profile is None:
        return
    tools = None if profile.tools is None else list(profile.tools)
    run.profile = RunProfile(
        name=profile.name, tools=tools, model=profile.model, max_tokens=profile.max_tokens
    )
    if profile.model:
        run.model = profile.model


def offered_tools(rt: Runtime, run: Run) -> list[str]:
    """The tools the model is offered: what the user may call now, narrowed by the profile."""
    allowed = rt.policy.allowed_tools(frozenset(run.requester.roles))
    return _filter(run).narrow(allowed) if run.profile else allowed


def authorize_caller(rt: Runtime, run: Run, tool_name: str) -> Denial | None:
    """None if the user may call the tool and the run's profile offers it."""
    denial = rt.policy.authorize_caller(tool_name, frozenset(run.requester.roles))
    if denial is not None or run.profile is None or _filter(run).offers(tool_name):
        return denial
    return Denial(
        f"You may not call {tool_name} here: the {run.profile.name} profile of this "
        "conversation does not offer it."
    )


def demos_for(rt: Runtime, run: Run) -> Selector | None:
    """The profile's own task library when it has one, else the default one."""
    if run.profile is not None and run.profile.name in rt.profile_demos:
        return rt.profile_demos[run.profile.name]
    return rt.demos


def model_name(run: Run) -> str:
    """The model a run asks for: its profile's; "" for the configured one."""
    return run.profile.model or "" if run.profile else ""


def max_tokens(rt: Runtime, run: Run) -> int:
    """The bound on one reply of the model: its profile's, else the configured one."""
    if run.profile is not None and run.profile.max_tokens:
        return run.profile.max_tokens
    return rt.settings.model_max_tokens


def _filter(run: Run) -> Profile:
    assert run.profile is not None
    tools = None if run.profile.tools is None else tuple(run.profile.tools)
    return Profile(name=run.profile.name, tools=tools)
