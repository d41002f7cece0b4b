"""The job features: status and results, schedules, and HTTP delivery's requests."""
