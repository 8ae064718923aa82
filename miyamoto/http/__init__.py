"""The HTTP front: the server and its request reader, connections, routes, tokens, media types, OpenAPI and the dashboard."""
