"""Programs the tests run in separate processes."""
