"""The API's routers, one per concern; `api.app.create_app` includes them."""
