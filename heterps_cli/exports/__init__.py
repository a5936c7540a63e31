"""Plans for the engines users train with (``heterps export``): each engine's own form of a plan."""
