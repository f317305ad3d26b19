"""The rank supervisor: the Ray actor Gangway trusts. It starts the rank program in a sandbox
and relays what it says; it never imports user code."""
