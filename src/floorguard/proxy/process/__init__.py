"""The guard's process: `serve`, the aiohttp application and its routes, the HTTP server and
its connections, workers, the admin page."""
