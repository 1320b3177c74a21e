"""The reading side: steps, the planner, the table, what a handler receives."""
