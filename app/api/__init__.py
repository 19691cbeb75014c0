"""HTTP routers: parse, call one service, map the result."""
