"""The memcache text protocol (port 22133): framing, commands, replies, auth, the connection."""
