"""How Slack's requests arrive and are read: the HTTP and Socket Mode servers, the
signature, the envelope check, payload reading and id shapes, the slash command's text."""
