"""Small tasks with exact rewards (the shapes task)."""
