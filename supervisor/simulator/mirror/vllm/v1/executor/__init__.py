"""See supervisor/simulator/mirror/__init__.py."""
