"""What a member is told: its configuration, its columns, its warehouse."""
