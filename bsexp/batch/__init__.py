"""The batch math and the policies, pure (no torch): plans, schedules, scaling rules, the frozen
layout, the LR and weight-decay math, the layout in force, the closed loop, the policies."""
