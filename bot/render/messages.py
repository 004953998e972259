"""Every string Switchboard shows in Slack, in one place, so it can be read as a whole.

Templates use `str.format`. Values that come from people or the model are escaped by the
caller (`bot.render.mrkdwn.escape`) before they are put into a template.
"""

from __future__ import annotations

# -- buttons and titles -------------------------------------------------------------------

APPROVE = "Approve"
REJECT = "Reject"
EDIT = "Edit"
APPROVE_ALL = "Approve all"
REJECT_ALL = "Reject all"
BATCH_HEADER = "Approvals needed: {count} calls"
BATCH_ASKED = "{user} asked to run these {count} calls. Decide each, or all at once."
BATCH_ITEM = "*{n}. {tool}*: {description}"
BATCH_CONFIRM = "Approve all {count} pending calls?"
BATCH_CONFIRM_RISKY = " Some are high-risk."
BATCH_CONFIRM_HIDDEN = (
    " {count} of them have arguments this card does not show in full: read them with "
    "Show all first."
)
BATCH_FALLBACK = "Approvals needed: {user} asked to run {count} calls"
BATCH_NOTHING_LEFT = "Nothing in this batch is waiting any more."
REMIND_DM = (
    ":bell: {user}'s call to *{tool}* is waiting for your decision (expires {expires}). {where}"
)
ESCALATED_DM = (
    ":arrow_double_up: Escalated to you: {user}'s call to *{tool}* has waited too long for "
    "a decision, and you may decide it now (expires {expires}). {where}"
)
REMIND_DM_CALLS = (
    ":bell: {user}'s {count} calls ({tools}) are waiting for your decision (the first expires "
    "{expires}). {where}"
)
ESCALATED_DM_CALLS = (
    ":arrow_double_up: Escalated to you: {user}'s {count} calls ({tools}) have waited too long "
    "for a decision, and you may decide them now (the first expires {expires}). {where}"
)
DIGEST_HEAD = ":bell: {count} more calls are waiting for your decision:"
DIGEST_ESCALATED = ":arrow_double_up: {count} more calls were escalated to you:"
DIGEST_LINE = "• {count} × {tools}, asked by {user}. {where}"
DIGEST_MORE = "• and {count} more cards: see Switchboard's App Home."
REMIND_LINK = "<{link}|Open the card>"
CARD_ESCALATED = ", or (escalated) {roles}"
REMIND_NO_LINK = "Find it in Switchboard's App Home."
CANCEL = "Cancel"
SHOW_ALL = "Show all"
VIEW_RUN = "View run"
VIEW = "View"
SAVE_DEMO = "Save as demonstration"
CLOSE = "Close"
SUBMIT_REJECT = "Reject"
SUBMIT_EDIT = "Approve with edits"
MODAL_EDIT_TITLE = "Edit and approve"
EDIT_INTRO = (
    "{user} asked to run *{tool}*. Change what you need: submitting approves, as you, "
    "exactly what is here, and the proposed call does not run."
)
EDIT_HIGH_RISK = ":warning: *{tool}* is high-risk: submitting this form is your confirmation."
EDIT_FIXED = "Kept as proposed (too long to edit here): {names}"
EDIT_UNLISTED = "Kept as proposed (not in the tool's schema, so not editable here): {names}"
EDIT_REQUIRED = "This field is required."
EDIT_NOT_AN_OPTION = "Choose one of the options."
EDIT_NOT_TEXT = "This must be text."
EDIT_TOO_LONG = "At most {limit} characters."
EDIT_TOO_LARGE = "The arguments are too large (the limit is {limit} bytes of JSON)."
EDIT_NOT_A_NUMBER = "This must be a number."
EDIT_NOT_AN_INTEGER = "This must be a whole number."
EDIT_NOT_JSON = "This must be valid JSON (at most 16 levels deep)."
EDIT_STALE = "This call changed since you opened the form; close it and use Edit again."
EDIT_TOOL_GONE = "{tool} is no longer available, so it cannot be edited."
EDIT_INVALID = "Your edit was not approved: {why}"
REJECT_INSTRUCTIONS_LABEL = "Tell the agent what to do instead (optional)"
REJECT_INSTRUCTIONS_PLACEHOLDER = "e.g. file it under HR with priority low"

MODAL_RUN_TITLE = "Switchboard run"
MODAL_ARGS_TITLE = "Tool call arguments"
MODAL_REJECT_TITLE = "Reject this call"
MODAL_REJECT_ALL_TITLE = "Reject all"
REJECT_ALL_INTRO = (
    "{user} asked to run these calls. This rejects the {count} you may decide that are still "
    "waiting. You may say why."
)
SUBMIT_REJECT_ALL = "Reject all"
REJECT_INTRO = "{user} asked to run *{tool}*. You may say why you reject it."
REJECT_REASON_LABEL = "Reason (optional, shown to the requester and the model)"
REJECT_REASON_PLACEHOLDER = "e.g. wrong project, ask IT first"

CONFIRM_APPROVE_TITLE = "Approve a high-risk call?"
CONFIRM_APPROVE_TEXT = "{tool} is marked high-risk. It will run once, with exactly these arguments."
CONFIRM_APPROVE_YES = "Approve"
CONFIRM_APPROVE_CUT_TITLE = "Approve what this card cuts?"
CONFIRM_APPROVE_CUT_TEXT = (
    "This card does not show {what} in full. {tool} will run once with the whole values: "
    "read them with Show all first."
)
CONFIRM_CUT_FIELDS = "the value of {fields}"
CONFIRM_CUT_MORE = " and {count} more"
CONFIRM_CUT_END = "the end of the arguments"
CONFIRM_CUT_BIDI = "text with direction controls (it may run differently from how it reads)"
CONFIRM_APPROVE_NO = "Not yet"
CONFIRM_CANCEL_TITLE = "Cancel this run?"
CONFIRM_CANCEL_TEXT = "Switchboard stops at its next step. Nothing already done is undone."
CONFIRM_CANCEL_YES = "Cancel the run"
CONFIRM_CANCEL_NO = "Keep going"

# -- progress -----------------------------------------------------------------------------

STATUS_WORKING = ":hourglass_flowing_sand: {text}…"
STATUS_FOR = "For {user}"
STATUS_DONE = ":white_check_mark: Done: {summary}"
STATUS_PARTIAL = ":warning: Stopped early: {why}"
STATUS_FAILED = ":x: Failed: {why}"
ASSISTANT_STATUS = "is working: {text}…"
ASSISTANT_LOADING = ["Thinking…", "Checking what I may use…", "Working on it…"]
STATUS_FALLBACK = "Switchboard: {text}"

# -- answers --------------------------------------------------------------------------------

ANSWER_FALLBACK = "Switchboard's answer"
ANSWER_REPLACED = "_This reply was interrupted; the answer is written again below._"
UNGROUNDED = (
    ":warning: Check {what}: {facts}. I could not find them in any tool result or in the question."
)
UNGROUNDED_NUMBERS = "these figures"
UNGROUNDED_OTHER = "these facts"
ANSWER_CUT = "_The answer was too long for Slack and was cut. Use View run to read all of it._"
PARTIAL_HEAD = ":warning: I stopped before finishing because {why}."
PARTIAL_DETAIL = "Details: {detail}"
PARTIAL_SO_FAR = "What I had so far:"
FAILED_HEAD = (
    ":x: Something went wrong on our side and this run failed. An admin can look at run `{run_id}`."
)
FOOTER = "{steps} · {tools} · {tokens} · {cost} · {time}"
FOOTER_PROFILE = "profile: {name}"  # leads the footer of a run with a profile
FOOTER_STEPS = "{n} step"
FOOTER_STEPS_PLURAL = "{n} steps"
FOOTER_NO_TOOLS = "no tools"
FOOTER_TOOLS = "tools: {names}"
FOOTER_TOKENS = "{n:,} tokens"
FOOTER_COST = "${cost:.4f}"
FOOTER_TIME = "{working} working"
FOOTER_TIME_WAITED = "{working} working, {total} in all"

REASONS = {
    "max_steps": "it reached its step limit",
    "deadline": "it ran out of time",
    "tokens": "it used up its token budget",
    "cost": "it reached its cost limit",
    "tool_calls": "it asked for more tool calls than it may make",
    "repeated_call": "the model asked for the same call twice",
    "cancelled": "the run was cancelled",
    "length": "the model's reply was cut off",
    "content_filter": "the model's reply was withheld by its content filter",
    "refused": "the model refused",
    "model_error": "the model call failed",
    "internal_error": "an internal error stopped it",
}
REASON_UNKNOWN = "of an unexpected problem"
CANCELLED_BY = "{user} cancelled the run"

# -- approval cards --------------------------------------------------------------------------

CARD_HEADER = "Approval needed: {tool}"
CARD_ASKED = "{user} asked to run *{tool}*: {description}"
CARD_ARGS_CUT = "_Some values are cut. Use Show all to read them in full._"
CARD_BIDI = (
    ":warning: *The arguments contain invisible text-direction characters* (shown as "
    "`\\u202e` and the like). They can make text read differently from what runs; "
    "check every value with Show all before approving."
)
ARGS_TOO_LARGE = (
    "_These arguments are too large to show in Slack. Read them with "
    "`switchboard approvals show {approval_id}` before deciding._"
)
CARD_WHO = "Who may decide: {approvers} · Expires {expires}"
CARD_FROM_THREAD = "From a run in {channel}."
CARD_FALLBACK = "Approval needed: {user} asked to run {tool}"
CARD_APPROVED = ":white_check_mark: Approved by {user} at {when}"
CARD_APPROVED_EDITED = ":pencil2: Approved with edits by {user} at {when}:\n{changes}"
CARD_CHANGE = "• *{field}*: {old} → {new}"
CARD_INSTRUCTIONS = "\nTold the agent: {text}"
CARD_REJECTED = ":no_entry_sign: Rejected by {user}"
CARD_REJECTED_REASON = ":no_entry_sign: Rejected by {user}: {reason}"
CARD_EXPIRED = ":hourglass: Expired: nobody decided in time, so it did not run"
CARD_WITHDRAWN_CANCELLED = ":leftwards_arrow_with_hook: Withdrawn: the run was cancelled"
CARD_WITHDRAWN = ":leftwards_arrow_with_hook: Withdrawn: the run ended ({reason})"
CARD_DECIDED_FALLBACK = "Approval for {tool}: {outcome}"

# -- answers to clicks (ephemeral) ----------------------------------------------------------------

NOT_ALLOWED_TO_DECIDE = "You can't decide this one. Who may: {approvers}."
ALREADY_DECIDED = "This was already decided: {outcome}."
APPROVAL_NOT_FOUND = "I can't find that approval request any more; it may have expired."
CANCELLING = "Cancelling run `{run_id}`. It stops at its next step."
CANCEL_NOT_ALLOWED = "Only the person who asked or an admin can cancel run `{run_id}`."
CANCEL_ALREADY_ENDED = "Run `{run_id}` has already ended."
RUN_NOT_FOUND = "I can't find run `{run_id}`. Runs are kept for a limited time."
RUN_NOT_YOURS = "You can only look at your own runs; run `{run_id}` is someone else's."
ARGS_NOT_YOURS = "Only the requester, the people who may decide and admins can see these."
WITHDRAWN_UNINSTALLED = "the Slack app was removed from the workspace"

# -- demonstrations (admins, from the run modal) ---------------------------------------------------

DEMO_SAVE_HINT = (
    "Admins: save this run's successful tool calls and its answer as a candidate "
    "demonstration. The model sees it only once it is accepted with `switchboard demos review`."
)
DEMO_SAVED = (
    "Saved as candidate `{demo_id}`; it is not shown to the model until accepted with "
    "`switchboard demos review`."
)
DEMO_ALREADY = "This run is already saved as demonstration `{demo_id}` ({status})."
DEMO_STATUS = {
    "candidate": "a candidate waiting for `switchboard demos review`",
    "accepted": "accepted: the model may be shown it",
}
DEMO_NOT_SAVED = "Not saved: {reason}."
DEMO_ADMINS_ONLY = "Only admins can save runs as demonstrations."

# -- receiving questions ----------------------------------------------------------------------

QUESTION_REJECTED = ":warning: {reason}"
STILL_WORKING = (
    "I'm still working on the previous question in this thread. "
    "Ask again once it's answered, or cancel it."
)
EMPTY_MENTION = (
    "Ask me a question after the mention, e.g. `@Switchboard what does SQL Basics cost?`"
)
ROLES_UNAVAILABLE = (
    ":warning: Nothing was done: I couldn't check your Slack user groups just now, and they "
    "decide what you may do here. Please try again in a minute; if this keeps happening, "
    "an admin should check that the app has the `usergroups:read` scope."
)
QUESTION_NOT_STARTED = (
    ":warning: I couldn't take your question just now, so nothing was started. Please ask "
    "again in a minute; if this keeps happening, tell an admin."
)
EXTERNAL_CANNOT_ASK = (
    "Sorry, Switchboard only takes questions from members of this workspace, "
    "not from people in other organisations."
)

ASSISTANT_GREETING = (
    "Hi! Ask me a question. Anything that changes something needs a person's OK first."
)
SUGGESTED_PROMPTS_TITLE = "Try asking"
SUGGESTED_PROMPTS = [
    {
        "title": "Course fees",
        "message": "What is the total fee for Django Fundamentals and its prerequisite?",
    },
    {"title": "Search tickets", "message": "Which open tickets mention the VPN?"},
    {"title": "File a ticket", "message": "File an IT ticket: my laptop won't start."},
]

# -- slash command ---------------------------------------------------------------------------

HELP = (
    "*Switchboard* answers questions with tools, and asks a person before it changes anything.\n"
    "• Mention me in a channel, DM me, or use my assistant panel.\n"
    "• `/switchboard runs [mine|all|@user] [status]`: recent runs "
    "(status: queued, running, awaiting_approval, completed, partial, failed)\n"
    "• `/switchboard run ID`: a run's steps, tools, decisions and costs\n"
    "• `/switchboard cancel ID`: stop a run you started\n"
    "• `/switchboard help`: this message"
)
COMMAND_UNKNOWN = "I don't know `{word}`. Try `/switchboard help`."
COMMAND_NOT_OURS = "Switchboard has no `{command}` command. Try `{ours} help`."
COMMAND_TOO_LONG = "That command is too long. Try `/switchboard help`."
COMMAND_BAD_ID = "`{text}` doesn't look like a run id (they look like `r18c2f3a9b1c2d3e4f5`)."
COMMAND_NEEDS_ID = "Which run? Use `/switchboard {verb} ID`."
RUNS_ADMIN_ONLY = "Only admins can list other people's runs. Showing yours."
RUNS_NONE = "No runs to show."
RUNS_HEADER = "Runs: {scope}"
RUNS_FALLBACK = "Your Switchboard runs"
RUNS_SCOPE_MINE = "yours"
RUNS_SCOPE_ALL = "everyone's"
RUNS_SCOPE_USER = "{user}'s"
RUNS_SCOPE_STATUS = "{scope}, {status}"
RUN_LINE = "`{run_id}` · {status} · {when} · {user}\n{question}"

# -- run modal ------------------------------------------------------------------------------

RUN_HEAD = "*Run* `{run_id}` · *{status}*{reason}\nAsked by {user} in {channel} on {when}"
RUN_QUESTION = "*Question:* {question}"
RUN_DEMOS = "*Demonstrations shown to the model:* {demos}"
RUN_NO_DEMOS = "*Demonstrations shown to the model:* none"
RUN_PROFILE = "*Profile:* {name} · *model:* {model}"
RUN_NO_PROFILE = "*Profile:* none (the defaults) · *model:* {model}"
RUN_TRACE = "*Trace:* <{url}|{trace_id}>"
RUN_TOTALS = (
    "*Totals:* {steps} steps · {tool_calls} tool calls · {tokens:,} tokens "
    "({prompt:,} in / {completion:,} out) · ${cost:.6f} · {working} working · {elapsed} in all"
)
RUN_ANSWER = "*Answer:*\n{answer}"
RUN_WHY = "*Why it ended:* {why}"
RUN_MORE_EVENTS = (
    "_{count} more events are not shown here; `switchboard runs show {run_id}` has all._"
)
EVENT_ASKED = "`+{offset}` asked by {user}: {question}"
EVENT_MODEL = (
    "`+{offset}` *model step {step}*: {finish} · {tokens} tokens · ${cost:.6f} · {seconds:.2f}s"
)
EVENT_MODEL_SAYS = "says: {content}"
EVENT_MODEL_CALL = "→ *{tool}* `{args}`"
EVENT_RESULT = "`+{offset}` *{tool}* {mark}: {result}"
EVENT_RESULT_OK = "ok"
EVENT_RESULT_ERROR = "error"
EVENT_DENIED = "`+{offset}` *{tool}* denied: {why}"
EVENT_INVALID = "`+{offset}` *{tool}* invalid arguments: {error}"
EVENT_APPROVAL = "`+{offset}` approval requested for *{tool}* `{args}`; may decide: {approvers}"
EVENT_DECIDED = "`+{offset}` *{status}* by {user}{reason}"
EVENT_GRANTED = (
    "`+{offset}` {user} allowed similar *{tool}* calls ({scope}; any {any}) · grant {grant_id}"
)
EVENT_CONNECT_NEEDED = (
    "`+{offset}` *{tool}* not run: {provider} acts as the person asking, who has not connected it"
)
EVENT_MORE_ACCESS = (
    "`+{offset}` *{tool}* not run: {provider} acts as the person asking, whose connection "
    "does not give {scopes}"
)
EVENT_COVERED = "`+{offset}` *{tool}* {args} approved by {user}'s standing grant {grant_id}"
EVENT_EDITED = " (with edits: {changes})"
EVENT_INSTRUCTIONS = " (told the agent: {text})"
EVENT_EXPIRED = "`+{offset}` approval for *{tool}* expired (not run)"
EVENT_REFUSED = "`+{offset}` {user} tried to decide but may not"
EVENT_CANCEL = "`+{offset}` {user} asked to cancel"
EVENT_END = "`+{offset}` *{status}*{why}"
EVENT_DEMO_SAVED = "`+{offset}` saved as candidate demonstration `{demo_id}` by {user}"
EVENT_UNGROUNDED = "`+{offset}` *facts not found* in any tool result or the question: {facts}"
EVENT_WRITE_RECONCILED = (
    "`+{offset}` *{tool}* was interrupted while it ran; the tool reports it had finished"
)
EVENT_WRITE_UNKNOWN = (
    "`+{offset}` *{tool}* was interrupted while it ran; its outcome is unknown and it was "
    "not retried"
)
EVENT_MODEL_STARTED = (
    "`+{offset}` asked the model (step {step}{attempt}; {deadline} s for the step)"
)
EVENT_MODEL_ATTEMPT = " attempt {attempt} of {attempts}"
EVENT_MODEL_FAILED = "`+{offset}` model attempt {attempt} of {attempts} failed: {error}{tokens}"
EVENT_TOKENS = {  # what a failed attempt cost, by how it is known (worker.model.Spent)
    "reported": " ({n:,} tokens)",
    "estimated": " (about {n:,} tokens, estimated from what it streamed)",
    "unknown": " (tokens unknown: the server never said)",
}
EVENT_OTHER = "`+{offset}` {kind}"

# -- App Home --------------------------------------------------------------------------------

HOME_TITLE = "Switchboard"
HOME_INTRO = (
    "Ask me anything in a channel (mention me), in a DM or in the assistant panel. "
    "Anything that changes something waits for a person's approval."
)
HOME_WAITING = "Waiting for your decision"
HOME_WAITING_NONE = "Nothing is waiting for you."
HOME_WAITING_LINE = "{user} wants to run *{tool}* `{args}` · expires {expires}"
HOME_MINE = "Your recent runs"
HOME_ALL = "Recent runs (everyone)"
HOME_PENDING_ALL = "All pending approvals"
HOME_FAILURES = "Recent failures"
HOME_SPEND = "*Today's spend:* ${cost:.4f} over {runs} runs ({tokens:,} tokens)"
HOME_NONE = "None."
HOME_PAGE = "{first}–{last} of {of}, the soonest to expire first"
HOME_PREVIOUS = "Previous"
HOME_NEXT = "Next"

# -- plain words ----------------------------------------------------------------------------

STATUS_WORDS = {
    "queued": "queued",
    "running": "running",
    "awaiting_approval": "waiting for approval",
    "completed": "completed",
    "partial": "stopped early",
    "failed": "failed",
}

# -- standing grants (bot/render/grants.py) --------------------------------------------------

GRANT_BUTTON = {
    "thread": "Approve and allow in this thread",
    "hour": "Approve and allow for 1 hour",
    "day": "Approve and allow for 1 day",
}
GRANT_WHERE = {
    "thread": "in this thread for up to a day",
    "hour": "for the next hour, in any conversation",
    "day": "for the next day, in any conversation",
}
MODAL_GRANT_TITLE = "Approve and allow"
SUBMIT_GRANT = "Approve and allow"
GRANT_INTRO = (
    "This approves {user}'s *{tool}* call now, and allows {user}'s later *{tool}* calls "
    "{where} without asking again, when their arguments match:"
)
GRANT_FIXED_NONE = "_No argument is fixed: any arguments of {tool} are allowed._"
GRANT_FIXED = "*Must be exactly as now, unless ticked below:*\n{lines}"
GRANT_FIXED_LINE = "• *{name}* = {value}"
GRANT_ABSENT = "(not set)"
GRANT_WIDEN_LABEL = "Allow any value for"
GRANT_WIDEN_HINT = (
    "Ticked arguments may be anything; every other one must be exactly as in this call."
)
GRANT_FOOTER = (
    "Each call it allows is recorded as approved by you and shown in the thread. It ends "
    "when its time is up, when the policy or the tool changes, or when it is revoked "
    "(App Home, _Allowed for you_)."
)
GRANT_NOT_ALLOWED = (
    "You may not allow similar calls of this tool: only {approvers} may, where the "
    "policy offers it."
)
GRANT_STALE = "This request changed since the form was opened; nothing was approved."
GRANT_INVALID = "That form names arguments the tool does not have; nothing was approved."
GRANT_NO_THREAD = "This run has no thread to allow calls in; nothing was approved."
GRANT_TOO_MANY = "{user} already has as many standing grants as allowed; revoke one first."
GRANT_MADE = ":white_check_mark: Approved, and allowed {where} ({grant_id})."
COVERED_LINE = (
    ":repeat: *{tool}* {args} approved by {user}'s standing grant ({scope}, until {until})"
)
COVERED_FALLBACK = "{count} call(s) approved by a standing grant"
HOME_GRANTS = "Allowed for you"
HOME_GRANTS_NONE = "No standing grants. Approving with “allow” makes one."
HOME_GRANT_LINE = (
    "*{tool}* for {requester}, allowed by {grantor} {where} · {constraint} · until {until}"
    " · used {uses}×"
)
HOME_GRANT_ANY = "any {names}"
HOME_GRANT_LAPSED = " · _no longer in force (the policy or the tool changed)_"
REVOKE = "Revoke"
REVOKED = "Revoked {grant_id}: it allows nothing more."
REVOKE_NOT_ALLOWED = "Only the grantor, the person it covers, or an admin may revoke it."
REVOKE_ENDED = "{grant_id} had already ended."
REVOKE_NOT_FOUND = "No such grant (it ended a while ago)."

# -- per-user connections (bot/render/connections.py) -------------------------------------

CONNECT_NEEDED = (
    ":link: *{label}* acts as you, and you have not connected your {label} account yet. "
    "Connect it, then enter the code the page shows you here (only you can finish it): I "
    "then go on with what you asked, here."
)
CONNECT_MORE_ACCESS = (
    ":link: *{label}* acts as you, and your {label} account is connected, but what you asked "
    "needs more access than the connection gives ({scopes}). Connect again to give it (the "
    "page asks for what you gave before too), then enter the code the page shows you here: "
    "I then go on with what you asked, here."
)
CONNECT_BUTTON = "Connect {label}"
CARD_ACTS_AS = (
    ":bust_in_silhouette: Acts as {user}'s {label} account (their own connection), "
    "whoever approves."
)
CONNECT_ENTER_CODE = "Enter code"
CONNECT_MODAL_TITLE = "Finish connecting"
CONNECT_MODAL_LABEL = "The code the connection page showed you"
CONNECT_MODAL_SUBMIT = "Connect"
CONNECT_DONE = ":white_check_mark: Your {label} account is connected: tools act as you there."
CONNECT_GOING_ON = "I am going on with what you asked, in its thread."
CONNECT_PREPARING = "Preparing your link to {label}…"
CONNECT_STEPS = (
    "1. Open {label} and sign in (the link works once, for {minutes} minutes).\n"
    "2. Enter the code the page then shows you below."
)
HOME_CONNECTIONS = "Your connections"
HOME_CONNECTIONS_INTRO = "Tools that act as you use these accounts, never anyone else's."
HOME_NOT_CONNECTED = "*{label}* · not connected"
HOME_CONNECTED = "*{label}* · connected since {since}"
HOME_CONNECTED_SCOPE = " · scope {scope}"
DISCONNECT = "Disconnect"
DISCONNECT_CONFIRM_TITLE = "Disconnect?"
DISCONNECT_CONFIRM = (
    "Tools stop acting as you at {label} until you connect again; the account is "
    "disconnected at {label} too where it allows it."
)
DISCONNECT_KEEP = "Keep it"
CONNECT_UNAVAILABLE = "Connecting {label} is not possible now: {why}"
