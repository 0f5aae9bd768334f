"""The example app: every feature of ratelimit_mw in one FastAPI service (``example_app.main``)."""
