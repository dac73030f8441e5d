"""The batch policy and its math: plans, schedules and scaling rules (pure), the policies, the finder."""
