"""The connection core every front end shares: limits, flow control, the close path."""
