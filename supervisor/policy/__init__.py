"""The pure decisions: verdicts, the ladder, the lifecycle table, rules over evidence. No I/O."""
