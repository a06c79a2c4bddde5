"""The agent: its tools, models, policy, MCP servers and provider adapters."""
