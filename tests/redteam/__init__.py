"""Red-team solutions for the grader (harness/): reward hacks, honest controls and broken controls."""
